"""Rewards: verifiers by name, and `score_tasks` for evaluation.

A reward function is a plain callable, in the shape TRL's reward functions take

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

where `columns` are the task-set columns of the same rows (`verifier`, `answer`, `tests`, `metadata`, `id`;
`tests`/`metadata` may be Python objects or their JSON text, as stored in parquet). A function returns 1.0 for a
verified pass, 0.0 for a fail, and None for a row it does not apply to (a row whose `verifier` names another
function); `score_tasks` counts None as a fail.

    REWARDS["math"]        training/rewards/math.py   final-answer check (numbers, fractions, "answer is X")
    REWARDS["code"]        training/rewards/code.py   unit tests run in sandbox/ (one `run_batch` per call)
    REWARDS["json_rules"]  training/rewards/rules.py  JSON output: jsonschema + expected values + rules

`score_tasks(tasks, completions)` dispatches every task to its verifier (all code tasks of the call in one
sandbox batch) and gives 1.0 only for a verified pass, else 0.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

RewardFn = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFn] = {}


class UnknownVerifier(KeyError):
    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0])


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register `fn` under `name`. A second, different function under the same name is an error."""

    def deco(fn: RewardFn) -> RewardFn:
        old = REWARDS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"reward {name!r} is already registered to {old.__module__}.{old.__qualname__}; "
                             f"refusing to replace it with {fn.__module__}.{fn.__qualname__}")
        REWARDS[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    try:
        return REWARDS[name]
    except KeyError:
        raise UnknownVerifier(f"unknown verifier {name!r}; known verifiers: {', '.join(sorted(REWARDS))}") from None


def task_columns(tasks: Sequence[Any]) -> dict[str, list[Any]]:
    """The `**columns` a reward function receives, built from Task records."""
    return {
        "id": [t.id for t in tasks],
        "verifier": [t.verifier for t in tasks],
        "answer": [t.answer for t in tasks],
        "tests": [t.tests for t in tasks],
        "metadata": [t.metadata for t in tasks],
    }


def score_tasks(tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[float]:
    """1.0 where the completion passes its task's verifier, else 0.0 (order kept).

    Tasks are grouped by verifier and each group is scored in one call, so all code tasks go to the sandbox
    as one batch. `options` (e.g. `concurrency=4`, `limits=Limits(...)`) are passed to every verifier; the
    ones a verifier does not know are ignored by it.
    """
    if len(tasks) != len(completions):
        raise ValueError(f"score_tasks: {len(tasks)} tasks but {len(completions)} completions")
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(task.verifier, []).append(i)
    for name in groups:
        get_reward(name)  # fail before any work when a verifier is unknown
    scores = [0.0] * len(tasks)
    for name, idx in groups.items():
        sub = [tasks[i] for i in idx]
        out = get_reward(name)([t.prompt for t in sub], [completions[i] for i in idx], **task_columns(sub), **options)
        for i, value in zip(idx, out):
            scores[i] = 1.0 if value == 1.0 else 0.0
    return scores


# Registration happens on import of the verifier modules.
from training.rewards import code as _code, math as _math, rules as _rules  # noqa: E402,F401,I001
