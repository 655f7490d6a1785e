"""Code repair: the task's visible tests run in the sandbox after every answer; a failure comes back as the next
user turn, naming what was expected ("f(2): expected 5, got -1"), and the episode ends once they pass.

The hidden tests (`Task.tests`) never run here: they judge the final program (the reward, pass@1). Every
program goes through the same `sandbox` jobs as the code reward (the local pool or the sandbox service), with
the same limits, in every turn: a hostile program in turn 2 is contained exactly as in turn 1 (tested).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from sandbox import Job
from training.environments.base import Step, register_environment
from training.rewards.code import code_job, parses, run_jobs
from training.tasksets.schema import Task, visible_tests


def failure_text(detail: str) -> str:
    """The part of a sandbox verdict's detail the model needs: the first failing test, naming what was expected
    ("f(2): expected 5, got -1"), without the tally in front. Short, because every reply token is context a
    small model's next turn must still fit in."""
    marker = "first failure: "
    return detail.split(marker, 1)[1] if marker in detail else detail


def repair_reply(error: str) -> str:
    """The user turn that shows a failed program's error and asks for the fix (also SFT's repair examples)."""
    error = " ".join(error.strip().splitlines()[-2:])[:160] or "wrong result"
    return f"# error: {error}\n# fixed:"


# Mistakes that read the task the other way: a sign, an operator, a case, a slice's side, an order, a
# comparison, which end a string goes on. Each flip is listed both ways; one applies to the returned expression.
_FLIPS: list[tuple[str, str]] = [
    (r"(?<=[\w)\]])\+(?=[\w(\[])", "-"),
    (r"(?<=[\w)\]])-(?=[\w(\[])", "+"),
    (r"(?<=[\w)\]])\*(?=[\w(\[])", "//"),
    (r"(?<=[\w)\]])//(?=[\w(\[])", "*"),
    (r"\.upper\(\)", ".lower()"),
    (r"\.lower\(\)", ".upper()"),
    (r"\[(\d+):\]", r"[:-\1]"),
    (r"\[:-(\d+)\]", r"[\1:]"),
    (r"sorted\((\w+)\)", r"sorted(\1,reverse=True)"),
    (r"sorted\((\w+),reverse=True\)", r"sorted(\1)"),
    (r"\bmax\(", "min("),
    (r"\bmin\(", "max("),
    (r"(?<=\w)>(?=\w)", "<"),
    (r"(?<=\w)<(?=\w)", ">"),
    (r"^(\w+)\+('.')$", r"\2+\1"),
    (r"^('.')\+(\w+)$", r"\2+\1"),
]


def near_miss(reference: str, rng: random.Random, other_reading: bool = False) -> str:
    """A wrong attempt close to `reference`, the kinds of mistake a model makes, one kind drawn at random among
    those the reference allows: the task read the other way (a flipped sign or operator, the other case, the
    other end of a slice or string, the reverse order: _FLIPS), one integer literal off by 1-3, or one quoted
    character changed; else the body returning None. `other_reading`: the task read the other way whenever the
    reference allows it (the mistake whose error says which reading was meant; an off-by-one constant asks the
    model to do the error's arithmetic instead)."""
    head, sep, body = reference.partition(":")
    prefix, body = (head + sep, body) if sep else ("", reference)
    code = body.lstrip()
    prefix += body[: len(body) - len(code)]  # the signature and the indentation, kept as they are
    readings: list[str] = []  # the task read the other way
    if code.startswith("return "):
        stem = code[len("return ") :]
        readings = [
            f
            for f in dict.fromkeys(
                f"return {re.sub(pat, rep, stem, count=1)}" for pat, rep in _FLIPS if re.search(pat, stem)
            )
            if f != code
        ]
    if other_reading and readings:
        return prefix + rng.choice(readings)
    kinds = [readings]  # each kind of mistake the reference allows (empty ones are dropped below)
    numbers = list(re.finditer(r"(?<![\w.])\d+", code))
    if numbers:
        options = []
        for m in numbers:
            for delta in (-3, -2, -1, 1, 2, 3):
                options.append(code[: m.start()] + str(max(0, int(m.group()) + delta)) + code[m.end() :])
        kinds.append([o for o in options if o != code])
    quoted = list(re.finditer(r"'(.)'", code))
    if quoted:
        kinds.append(
            [code[: m.start(1)] + c + code[m.end(1) :] for m in quoted for c in "abcdefxyz" if c != m.group(1)]
        )
    kinds = [k for k in kinds if k]
    if not kinds:
        return f"{head}: return None" if sep else "return None"
    return prefix + rng.choice(rng.choice(kinds))


def mirror_tasks(tasks: Sequence[Task], programs: Sequence[str]) -> list[Task | None]:
    """For each task, the task with the same prompt whose tests ask for what its `program` returns: each test's
    call, expecting the program's value, run in the sandbox as one batch (the values come back as JSON on
    stdout). A repair example and its mirror (SFT's `repair_mirrors`) show the same prompt with error-led fixes
    in both directions. None for a test program, a program that fails on a call, returns what JSON cannot carry
    or passes the task's own tests, and for visible tests that are not among the tests."""
    import json
    from dataclasses import replace

    jobs, rows = [], []
    for i, (task, program) in enumerate(zip(tasks, programs)):
        tests = task.tests
        if isinstance(tests, list) and tests and all(isinstance(t, dict) and "call" in t for t in tests):
            calls = ", ".join(str(t["call"]) for t in tests)
            probe = f"{program}\nimport json as _json\nprint(_json.dumps([{calls}]))\n"
            jobs.append(Job(probe, (), None, id=f"{task.id}#mirror"))
            rows.append(i)
    out: list[Task | None] = [None] * len(tasks)
    for i, verdict in zip(rows, run_jobs(jobs) if jobs else []):
        task = tasks[i]
        try:
            values = json.loads(verdict.stdout.strip().splitlines()[-1]) if verdict.ok else None
        except (ValueError, IndexError):
            continue
        tests = task.tests if isinstance(task.tests, list) else []
        if not isinstance(values, list) or len(values) != len(tests) or values == [t.get("expected") for t in tests]:
            continue
        mirrored = {str(t["call"]): {**t, "expected": v} for t, v in zip(tests, values)}
        shown = visible_tests(task)
        if not isinstance(shown, list) or not all(
            isinstance(t, dict) and str(t.get("call")) in mirrored for t in shown
        ):
            continue
        metadata = {
            **(task.metadata if isinstance(task.metadata, dict) else {}),
            "visible_tests": [mirrored[str(t["call"])] for t in shown],
        }
        out[i] = replace(
            task, id=f"{task.id}~mirror", reference=programs[i], tests=list(mirrored.values()), metadata=metadata
        )
    return out


@register_environment("code_repair")
class CodeRepairEnv:
    """One repair episode of a code task. `limits` (sandbox.Limits) and `run` (jobs -> verdicts; default the
    code reward's `run_jobs`) are options for tests and deployments."""

    name = "code_repair"

    def __init__(self, task: Task, limits: Any = None, run: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self.task = task
        self.limits = limits
        self.run = run
        self.turn = 0

    def reset(self, task: Task) -> list[dict[str, str]]:
        self.task, self.turn = task, 0
        return [{"role": "user", "content": task.prompt}]

    def step(self, completion: str) -> Step:
        return self.step_batch([self], [completion])[0]

    @staticmethod
    def planted_attempt(task: Task, rng: random.Random) -> str | None:
        """A wrong first answer an episode may start from (rl_round's `planted_share`): a near miss of the
        task's reference, the task read the other way where it can be, None without a reference. Whether it
        fails the visible tests is for the caller to check."""
        return near_miss(task.reference, rng, other_reading=True) if task.reference else None

    # rl_round's planted_mirrors: the tasks asking for what planted answers return (module function above)
    mirror_tasks = staticmethod(mirror_tasks)

    @classmethod
    def step_batch(cls, envs: Sequence[CodeRepairEnv], completions: Sequence[str]) -> list[Step]:
        """Every program of this turn against its visible tests, as one sandbox batch."""

        out: list[Step | None] = [None] * len(envs)
        jobs, rows = [], []
        for i, (env, completion) in enumerate(zip(envs, completions)):
            env.turn += 1
            shown = visible_tests(env.task)
            job = code_job(completion, shown, env.task.metadata, f"{env.task.id}#turn{env.turn}", env.limits)
            if not shown:  # nothing the model may see run: the episode cannot get feedback
                out[i] = Step(None, True, {"status": "no_visible_tests", "visible_passed": False})
            elif job is None:
                out[i] = Step(repair_reply("no code to run"), False, {"status": "no_code", "visible_passed": False})
            elif not parses(job.program):
                out[i] = Step(
                    repair_reply("the program is not valid Python"),
                    False,
                    {"status": "syntax", "visible_passed": False},
                )
            else:
                jobs.append(job)
                rows.append(i)
        if jobs:
            run = envs[rows[0]].run or run_jobs
            for i, verdict in zip(rows, run(jobs)):
                passed = verdict.status.value == "passed"
                detail = verdict.detail or verdict.stderr or verdict.status.value
                out[i] = Step(
                    None if passed else repair_reply(failure_text(detail)),
                    passed,
                    {"status": verdict.status.value, "visible_passed": passed, "detail": detail, "verdict": verdict},
                )
        return [s for s in out if s is not None]
