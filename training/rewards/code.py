"""The code verifier: run each completion against its task's unit tests in `sandbox/`, one batch per call.

How the program is assembled (the same for synthetic and loaded tasks):

    program = metadata.get("program_prefix", "") + extract_program(completion) + metadata.get("program_suffix", "")

`extract_program` takes the first fenced block (```python ... ```) when the completion has one, else the
completion as-is. Tiny-profile tasks have no prefix (the completion is the whole `def f(x): ...`); HumanEval
tasks put the signature and docstring in `program_prefix` (the completion continues the body); MBPP tasks put
`test_setup_code` there. Each test is a `sandbox.TestCase(call, expected)`: the call is evaluated after the
program ran and its value compared on the host. The reward is 1.0 only when the sandbox reports
`Status.PASSED` (every test passed); a timeout, crash, wrong value, malformed test or empty completion is 0.0.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from training.rewards import register_reward

_FENCE_RE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_program(completion: str) -> str:
    """The code in a completion: its first fenced block if it has one, else the whole text."""
    if "```" in completion:
        m = _FENCE_RE.search(completion)
        if m:
            return m.group(1)
    return completion


def _as_obj(value: Any, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, str):
        return json.loads(value) if value.strip() else default
    return value


def assemble_program(completion: str, metadata: dict[str, Any] | None = None) -> str:
    meta = metadata or {}
    return str(meta.get("program_prefix", "")) + extract_program(completion) + str(meta.get("program_suffix", ""))


def parses(program: str) -> bool:
    """Whether `program` is syntactically valid Python. A program that is not cannot pass its tests, so the
    reward skips its sandbox run (early in RL most sampled programs are like that). `ast.parse` only parses:
    no code runs and no constant folding happens on the host; CPython bounds nesting depth itself."""
    try:
        ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: null bytes (Python < 3.12)
        return False
    return True


def code_job(completion: str, tests: Any, metadata: Any, job_id: str, limits: Any = None) -> Any:
    """The sandbox Job checking one completion against its task's tests (stored objects or their JSON text).
    None when nothing can be verified: an empty completion, no tests, or malformed tests."""
    if not completion.strip():
        return None
    from sandbox import Job, TestCase

    try:
        cases = [TestCase.from_dict(t, f"tests[{k}]") for k, t in enumerate(_as_obj(tests, []))]
        meta = _as_obj(metadata, {})
    except (ValueError, TypeError):
        return None
    return Job(assemble_program(completion, meta), cases, limits, id=job_id) if cases else None


@register_reward("code")
def code_reward(prompts: Sequence[str], completions: Sequence[str], *, tests: Sequence[Any] | None = None,
                metadata: Sequence[Any] | None = None, verifier: Sequence[str] | None = None,
                id: Sequence[str] | None = None, concurrency: int | None = None, limits: Any = None,
                **_: Any) -> list[float | None]:
    """1.0 when the assembled program passes all of its tests in the sandbox. All runnable rows of the call
    go to one `sandbox.run_batch` (a program that does not parse is 0.0 without a run). None for rows of
    another verifier."""
    n = len(completions)
    out: list[float | None] = [None] * n
    jobs, rows = [], []
    for i in range(n):
        if verifier is not None and verifier[i] != "code":
            continue
        out[i] = 0.0
        job = code_job(completions[i], tests[i] if tests is not None else None,
                       metadata[i] if metadata is not None else None, f"{id[i] if id is not None else 'row'}#{i}",
                       limits)
        if job is not None and parses(job.program):
            jobs.append(job)
            rows.append(i)
    if jobs:
        from sandbox import Status, run_batch

        for i, verdict in zip(rows, run_batch(jobs, concurrency=concurrency)):  # None: run_batch's default
            out[i] = 1.0 if verdict.status == Status.PASSED else 0.0
    return out
