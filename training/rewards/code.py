"""The code verifier: run each completion against its task's unit tests in `sandbox/`, one batch per call.

How the program is assembled (the same for synthetic and loaded tasks):

    program = metadata.get("program_prefix", "") + extract_program(completion) + metadata.get("program_suffix", "")

`extract_program` takes the first fenced block (```python ... ```) when the completion has one, else the
completion as-is. Tiny-profile tasks have no prefix (the completion is the whole `def f(x): ...`); HumanEval
tasks put the signature and docstring in `program_prefix` (the completion continues the body); MBPP tasks put
`test_setup_code` there. Each test is a `sandbox.TestCase(call, expected)`: the call is evaluated after the
program ran and its value compared on the host. The reward is 1.0 only when the sandbox reports
`Status.PASSED` (every test passed); a timeout, crash, wrong value, malformed test or empty completion is 0.0.

`tests` is either that list of {call, expected} pairs, or one whole test program (HumanEval, MBPP):

    {"program": "def check(candidate): ...", "entry_point": "add", "setup": "<prompt>"}

which the sandbox runs as a `sandbox.TestProgram` (the test in its own process, calling the candidate's
functions in another over plain values; see sandbox/README.md).

Where the code runs: the local sandbox pool, or, when a sandbox URL is set, the sandbox HTTP service
(`sandbox/server.py`, e.g. compose's `http://sandbox:8081`), which is how a GPU worker hands execution to a CPU
sandbox fleet. The URL comes from the stage config's `sandbox_url` (`use_remote_sandbox`) or the environment's
`POSTTRAIN_SANDBOX_URL`; the token from `POSTTRAIN_SANDBOX_TOKEN` (the operator passes the `sandbox_default`
Airflow connection's password as that variable). The verdicts, and so the rewards, are the same either way.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import sandbox
from sandbox import Job, Status, TestCase, TestProgram
from sandbox.client import RemoteSandbox
from training.rewards.base import REWARDS, Verifier, register_verifier

SANDBOX_URL_ENV = "POSTTRAIN_SANDBOX_URL"
SANDBOX_TOKEN_ENV = "POSTTRAIN_SANDBOX_TOKEN"
_remote_url: str | None = None  # set by a stage from its config; None = the environment decides


def use_remote_sandbox(url: str | None) -> None:
    """Send this process's code jobs to the sandbox service at `url` ("" or None: the environment's
    POSTTRAIN_SANDBOX_URL, else the local pool). Stages call it with their config's `sandbox_url`."""
    global _remote_url
    _remote_url = url or None


def sandbox_url() -> str:
    """The sandbox service code jobs go to ("" = the local pool)."""
    return _remote_url or os.environ.get(SANDBOX_URL_ENV, "").strip()


def run_jobs(jobs: list[Any], concurrency: int | None = None) -> list[Any]:
    """Verdicts of `jobs` (in order) from the remote service when one is set, else from the local pool.

    Identical jobs (the same program, tests and limits) run once and share the verdict, under each job's own
    id: a reward is a function of the program and its tests, and a GRPO group's samples often repeat one
    program (most of a trained model's groups are a few distinct answers)."""
    import dataclasses

    first: dict[str, int] = {}
    unique: list[Any] = []
    slot: list[int] = []
    for job in jobs:
        key = repr((job.program, job.tests, job.limits, job.test_program))  # tests may hold lists: not hashable
        if key not in first:
            first[key] = len(unique)
            unique.append(job)
        slot.append(first[key])
    verdicts = _run_unique(unique, concurrency) if unique else []
    return [
        verdicts[k] if unique[k] is job else dataclasses.replace(verdicts[k], id=job.id) for job, k in zip(jobs, slot)
    ]


def _run_unique(jobs: list[Any], concurrency: int | None) -> list[Any]:
    url = sandbox_url()
    if url:
        return RemoteSandbox(url, os.environ.get(SANDBOX_TOKEN_ENV, "").strip() or None).run_batch(jobs)

    # looked up on the package when called, so a test can spy on the pool's batches
    return sandbox.run_batch(jobs, concurrency=concurrency)  # None: run_batch's default


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


_TEST_KEYS = {"call", "expected", "rel_tol", "abs_tol"}
_PROGRAM_KEYS = {"program", "entry_point", "setup"}


def test_program(tests: Any) -> Any:
    """The sandbox.TestProgram a `{"program": ...}` tests object describes (raises ValueError when malformed)."""

    unknown = set(tests) - _PROGRAM_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}; allowed: program, entry_point, setup")
    if not isinstance(tests.get("program"), str):
        raise ValueError("'program' must be the test program's source text")
    return TestProgram(tests["program"], tests.get("entry_point"), tests.get("setup") or "")


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def tests_problem(tests: Any) -> str | None:
    """What is wrong with a code task's tests (None when they are usable)."""
    if isinstance(tests, dict):
        try:
            test_program(tests)
        except ValueError as exc:
            return f"test program: {exc}"
        return None
    if not tests:
        return 'a code task needs at least one test ({"call": ..., "expected": ...}) or a test program'
    if not isinstance(tests, list):
        return f"expected a list of {{call, expected}} objects or a {{program, ...}} object, got {_type_name(tests)}"
    for i, t in enumerate(tests):
        if not isinstance(t, dict):
            return f"tests[{i}]: expected an object, got {_type_name(t)}"
        unknown = set(t) - _TEST_KEYS
        if unknown:
            return f"tests[{i}]: unknown key(s) {sorted(unknown)}; allowed: call, expected, rel_tol, abs_tol"
        if "call" not in t or "expected" not in t:
            return f"tests[{i}]: missing {'call' if 'call' not in t else 'expected'!r}"
        call = t["call"]
        if not isinstance(call, str) or not call.strip():
            return f"tests[{i}].call: expected a non-empty expression string, got {_show(call)}"
        if not _is_expression(call):
            return f"tests[{i}].call: {_show(call)} is not a Python expression"
    return None


_COMPILED: dict[str, bool] = {}


def _is_expression(call: str) -> bool:
    ok = _COMPILED.get(call)
    if ok is None:
        try:
            compile(call, "<call>", "eval")
            ok = True
        except (SyntaxError, ValueError):
            ok = False
        if len(_COMPILED) < 200_000:
            _COMPILED[call] = ok
    return ok


def code_job(completion: str, tests: Any, metadata: Any, job_id: str, limits: Any = None) -> Any:
    """The sandbox Job checking one completion against its task's tests (stored objects or their JSON text).
    None when nothing can be verified: an empty completion, no tests, or malformed tests."""
    if not completion.strip():
        return None

    try:
        tests = _as_obj(tests, [])
        meta = _as_obj(metadata, {})
        if isinstance(tests, dict):
            return Job(assemble_program(completion, meta), (), limits, id=job_id, test_program=test_program(tests))
        cases = [TestCase.from_dict(t, f"tests[{k}]") for k, t in enumerate(tests)]
    except (ValueError, TypeError):
        return None
    return Job(assemble_program(completion, meta), cases, limits, id=job_id) if cases else None


def _verdicts(
    tasks: Sequence[Any], completions: Sequence[str], concurrency: int | None = None, limits: Any = None
) -> list[Any]:
    """The sandbox verdict of every completion (None where nothing ran: empty, unusable tests, no parse). All
    runnable rows go to one batch (`run_jobs`: the local pool or the remote service)."""
    out: list[Any] = [None] * len(completions)
    jobs, rows = [], []
    for i, (task, completion) in enumerate(zip(tasks, completions)):
        job = code_job(
            completion, task.tests, task.metadata, f"{task.id if task.id is not None else 'row'}#{i}", limits
        )
        if job is not None and parses(job.program):
            jobs.append(job)
            rows.append(i)
    if jobs:
        for i, verdict in zip(rows, run_jobs(jobs, concurrency)):
            out[i] = verdict
    return out


class CodeVerifier(Verifier):
    """Programs against unit tests or a whole test program, in the sandbox; failures explained by its verdict."""

    name = "code"
    repairable = True
    environment = "code_repair"
    instruction = "Write the complete Python function in one ```python code block."

    def score(
        self,
        tasks: Sequence[Any],
        completions: Sequence[str],
        *,
        concurrency: int | None = None,
        limits: Any = None,
        **_: Any,
    ) -> list[float | None]:

        return [
            1.0 if v is not None and v.status == Status.PASSED else 0.0
            for v in _verdicts(tasks, completions, concurrency, limits)
        ]

    def format_ok(self, task: Any, completion: str) -> bool:
        return bool(completion.strip()) and parses(assemble_program(completion, _as_obj(task.metadata, {})))

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        problem = tests_problem(tests)
        visible = (metadata or {}).get("visible_tests")
        if visible is not None and visible != []:
            shown = tests_problem(_as_obj(visible, []))
            if shown:
                return ([("tests", problem)] if problem else []) + [("metadata", f"visible_tests: {shown}")]
        return [("tests", problem)] if problem else []

    def explain(
        self,
        tasks: Sequence[Any],
        completions: Sequence[str],
        *,
        concurrency: int | None = None,
        limits: Any = None,
        **_: Any,
    ) -> list[str]:

        out = []
        for task, completion, v in zip(tasks, completions, _verdicts(tasks, completions, concurrency, limits)):
            if v is None:
                out.append(
                    "no code to run"
                    if not completion.strip()
                    else "the program is not valid Python"
                    if not self.format_ok(task, completion)
                    else "no usable tests"
                )
            else:
                out.append("" if v.status == Status.PASSED else v.detail or v.stderr or v.status.value)
        return out


register_verifier(CodeVerifier())
code_reward = REWARDS["code"]
