"""The spec of one real-data source of a task set (the `sources` list of `posttrain build-taskset`)."""

from __future__ import annotations

from dataclasses import dataclass, field

PROFILES = ("tiny", "data")
ADAPTERS = ("tasks", "gsm8k", "math", "mbpp", "humaneval", "mapped")


@dataclass(frozen=True)
class SourceSpec:
    """One real-data source, loaded through `datasets` and turned into Task rows by an adapter.

    path:       a hub id ("openai/gsm8k") or a local file (.jsonl / .json / .parquet; .jsonl is read line by
                line so every error names its line).
    adapter:    "tasks" (rows already in the Task shape), "gsm8k" (question / answer with "#### X"), "math"
                (MATH: problem / solution with \\boxed{}), "mbpp" (text or prompt / code / test_list of asserts),
                "humaneval" (prompt / canonical_solution / test with check(candidate) / entry_point),
                "mapped" (any JSONL, through `fields`).
    name:       hub config name ("main" for gsm8k); split: hub split ("train", "test").
    limit:      keep the first `limit` rows (0 = all).
    fields:     mapped: Task field -> source column, e.g. {"prompt": "question", "answer": "label"}. Unmapped
                fields keep the column of the same name when it exists.
    domain, verifier, difficulty: when set, they replace what the gsm8k/mbpp/humaneval adapters derive, and
                fill in tasks/mapped rows that lack the field.
    id_prefix:  prefix of generated ids (default: the file stem or hub id and "-"): "gsm8k-" -> "gsm8k-17"
                (the row number; MBPP uses its task_id); HumanEval ids are task_id, prefixed only when set.
    """

    path: str
    adapter: str = "tasks"
    name: str | None = None
    split: str = "train"
    limit: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    domain: str = ""
    verifier: str = ""
    difficulty: int = 0
    id_prefix: str = ""

    def __post_init__(self) -> None:
        if self.adapter not in ADAPTERS:
            raise ValueError(f"sources: adapter {self.adapter!r} is not one of {', '.join(ADAPTERS)}")
        if self.limit < 0:
            raise ValueError("sources: limit must be >= 0")
