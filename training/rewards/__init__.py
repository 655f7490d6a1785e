"""Rewards: verifiers by name (one `Verifier` interface, training/rewards/base.py), weighted combinations of
them, and `score_tasks` for training and evaluation.

    VERIFIERS["math"]        training/rewards/math.py    final answers: exact numbers, then math-verify (symbolic)
    VERIFIERS["code"]        training/rewards/code.py    unit tests or a whole test program, run in sandbox/
    VERIFIERS["json_rules"]  training/rewards/rules.py   JSON output: jsonschema + expected values + rules
    VERIFIERS["ifeval"]      training/rewards/instructions.py  several IFEval-style verifiable constraints at once
    VERIFIERS["judge"]       training/rewards/judge.py   a judge model (local transformers or an OpenAI-compatible
                                                         endpoint) scores the completion against a rubric
    VERIFIERS["format"]      training/rewards/format.py  the completion has the shape its task's verifier needs

Each is also a TRL-shaped reward function in `REWARDS` (`fn(prompts, completions, **columns)`: 1.0 pass,
0.0 fail, None for a row it does not apply to).

Weighted rewards: a task names several verifiers with weights in `metadata["reward_weights"]`, e.g.
`{"math": 0.9, "format": 0.1}` (build-taskset's `reward_weights` stamps it on every task of a domain). Its reward
is the weighted mean of the components that apply (None: not applicable, its weight left out); without weights
the task's own `verifier` is the whole reward. `score_tasks` returns those rewards as a `Scores` list carrying
each component (`.components`, logged per step by the RL stage) and whether the task's own verifier passed
(`.passed`, what evaluation counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from training.rewards.base import (
    REWARDS,
    VERIFIERS,
    FunctionVerifier,
    RewardFn,
    UnknownVerifier,
    Verifier,
    find_verifier,
    get_reward,
    get_verifier,
    load_plugins,
    register_reward,
    register_verifier,
    reward_fn,
    task_columns,
    verifier_names,
)

__all__ = [
    "REWARDS",
    "VERIFIERS",
    "FunctionVerifier",
    "RewardFn",
    "Scores",
    "UnknownVerifier",
    "Verifier",
    "get_reward",
    "find_verifier",
    "get_verifier",
    "load_plugins",
    "register_reward",
    "register_verifier",
    "reward_fn",
    "reward_weights",
    "score_tasks",
    "task_columns",
    "verifier_names",
    "verify_tasks",
]


class Scores(list):
    """The reward per task (a list of floats), plus `components` ({verifier: [score | None per task]}) and
    `passed` (did the task's own verifier pass)."""

    def __init__(self, values: Sequence[float], components: dict[str, list[float | None]], passed: list[bool]):
        super().__init__(values)
        self.components = components
        self.passed = passed


def reward_weights(task: Any) -> dict[str, float]:
    """{verifier: weight} for one task: metadata["reward_weights"], else its own verifier alone."""
    meta = task.metadata if isinstance(task.metadata, dict) else {}
    weights = meta.get("reward_weights")
    if isinstance(weights, dict) and weights:
        return {str(k): float(v) for k, v in weights.items()}
    return {task.verifier: 1.0}


def weighted(values: dict[str, float | None], weights: dict[str, float]) -> float:
    """The weighted mean of the components that apply; 0.0 when none does."""
    num = den = 0.0
    for name, w in weights.items():
        v = values.get(name)
        if v is not None and w > 0:
            num += w * float(v)
            den += w
    return num / den if den else 0.0


def score_tasks(tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> Scores:
    """The reward of each completion (order kept): its task's verifier, or its weighted verifiers.

    Each verifier is called once for all the rows that name it, so all code tasks go to the sandbox as one
    batch. `options` (e.g. `concurrency=4`, `limits=Limits(...)`) are passed to every verifier; the ones a
    verifier does not know are ignored by it. A verifier's None counts as not applicable in a weighted reward
    and as 0.0 alone.
    """
    if len(tasks) != len(completions):
        raise ValueError(f"score_tasks: {len(tasks)} tasks but {len(completions)} completions")
    weights = [reward_weights(t) for t in tasks]
    groups: dict[str, list[int]] = {}
    for i, (task, w) in enumerate(zip(tasks, weights)):
        for name in dict.fromkeys([task.verifier, *w]):
            groups.setdefault(name, []).append(i)
    verifiers = {name: get_verifier(name) for name in groups}  # fail before any work when one is unknown
    components: dict[str, list[float | None]] = {name: [None] * len(tasks) for name in groups}
    for name, idx in groups.items():
        out = verifiers[name].score([tasks[i] for i in idx], [completions[i] for i in idx], **options)
        for i, value in zip(idx, out):
            components[name][i] = None if value is None else float(value)
    values = []
    passed = []
    for i, (task, w) in enumerate(zip(tasks, weights)):
        own = components[task.verifier][i]
        passed.append(verifiers[task.verifier].passes(own))
        if len(w) == 1 and task.verifier in w:
            values.append(own if own is not None else 0.0)
        else:
            values.append(weighted({name: components[name][i] for name in w}, w))
    return Scores(values, components, passed)


def verify_tasks(tasks: Sequence[Any], completions: Sequence[str], strict: bool = False, **options: Any) -> list[bool]:
    """Did each completion pass its task's own verifier (lenient, or `strict`: in the required format)?"""
    if len(tasks) != len(completions):
        raise ValueError(f"verify_tasks: {len(tasks)} tasks but {len(completions)} completions")
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(task.verifier, []).append(i)
    verifiers = {name: get_verifier(name) for name in groups}
    out = [False] * len(tasks)
    for name, idx in groups.items():
        v = verifiers[name]
        fn = v.strict if strict else v.score
        for i, value in zip(idx, fn([tasks[i] for i in idx], [completions[i] for i in idx], **options)):
            out[i] = v.passes(value)
    return out


# Registration happens on import of the verifier modules; other packages' on the first lookup
# (training/rewards/base.py: load_plugins).
import importlib  # noqa: E402

for _verifier_module in ("code", "format", "instructions", "judge", "math", "rules"):
    importlib.import_module(f"training.rewards.{_verifier_module}")
