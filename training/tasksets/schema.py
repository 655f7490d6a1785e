"""The task record: the one shape every task has, whatever its domain or source.

Stored as parquet (through `datasets`) with `tests` and `metadata` as JSON text, so the Arrow schema is the
same for every domain and a file written today reads back tomorrow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DOMAINS = ("math", "code", "extraction", "instruction")
MIN_DIFFICULTY, MAX_DIFFICULTY = 1, 5

# Column order in parquet files; also the field order a `taskset check` error walks through.
COLUMNS = ("id", "domain", "prompt", "verifier", "reference", "answer", "tests", "difficulty", "source", "metadata")


@dataclass(frozen=True)
class Task:
    """One verifiable task.

    id:         unique within a task set.
    domain:     "math", "code", "extraction", "instruction" (user sets may add domains).
    prompt:     what the model sees.
    verifier:   name in the reward registry (training/rewards): "math", "code", "json_rules", "ifeval".
    reference:  one correct completion (the SFT target); "" when the source has none (RL-only tasks).
    answer:     math: the final answer; extraction: the expected JSON text; None for code.
    tests:      code: [{"call": "f(2)", "expected": 4}, ...] or one test program {"program": ..., "entry_point"?,
                "setup"?}, run in sandbox/; [] otherwise. These are the hidden tests: the reward and pass@1.
                metadata["visible_tests"] (same shapes) are the ones a model may see run during an episode
                (training/environments); see `visible_tests`.
    difficulty: 1 (easiest) .. 5, for curriculum and stratified splits.
    source:     where it came from, e.g. "synthetic:arithmetic@seed=0", "gsm8k:train", "file:tasks.jsonl".
    metadata:   free-form JSON (extraction: {"schema": {...}}; anything a verifier needs).
    """

    id: str
    domain: str
    prompt: str
    verifier: str
    reference: str = ""
    answer: str | None = None
    tests: list[dict[str, Any]] | dict[str, Any] = field(default_factory=list)
    difficulty: int = 1
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "domain": self.domain,
            "prompt": self.prompt,
            "verifier": self.verifier,
            "reference": self.reference,
            "answer": self.answer,
            "tests": json.dumps(self.tests, sort_keys=True),
            "difficulty": int(self.difficulty),
            "source": self.source,
            "metadata": json.dumps(self.metadata, sort_keys=True),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """Inverse of to_row for rows that already passed validation (tasksets/validate.py)."""
        return cls(
            id=row["id"],
            domain=row["domain"],
            prompt=row["prompt"],
            verifier=row["verifier"],
            reference=row.get("reference") or "",
            answer=row.get("answer"),
            tests=json.loads(row["tests"]) if isinstance(row.get("tests"), str) else row.get("tests") or [],
            difficulty=int(row.get("difficulty", 1)),
            source=row.get("source") or "",
            metadata=json.loads(row["metadata"])
            if isinstance(row.get("metadata"), str)
            else dict(row.get("metadata") or {}),
        )


def visible_tests(task: Task) -> list[dict[str, Any]] | dict[str, Any]:
    """The tests an environment may run and show the model (the hidden `tests` judge the final program).

    metadata["visible_tests"] when the task names them (tiny generators, the HumanEval and MBPP loaders);
    else, for task files written before visible tests existed, the first of a list of {call, expected} tests
    (MBPP's convention: the prompt shows one test), and none for a whole test program (running it would show
    the hidden tests' failures)."""
    named = task.metadata.get("visible_tests") if isinstance(task.metadata, dict) else None
    if named is not None:
        return json.loads(named) if isinstance(named, str) else named
    if isinstance(task.tests, list):
        return list(task.tests[:1])
    return []
