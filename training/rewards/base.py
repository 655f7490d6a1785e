"""The one interface every verifier implements, and the registry of verifiers by name.

A `Verifier` keeps everything about one way of judging a completion in one place:

    score(tasks, completions, **options)   -> [1.0 | 0.0 | a value in [0, 1] | None]   the reward (lenient)
    strict(tasks, completions, **options)  -> the same, counting only answers in the required format
    format_ok(task, completion)            -> does the completion have the shape this verifier can judge?
    row_problems(answer, tests, metadata)  -> [(field, message)]: what is wrong with a task row for it
    explain(tasks, completions, **options) -> one line per completion: why it failed ("" for a pass)
    passes(value)                          -> does a score count as a pass (evaluation's pass@k)?

`tasks` are `Task` records (or anything with the same attributes). `options` are what the caller knows about
execution (`concurrency`, `limits` for the sandbox; judge settings); a verifier ignores the ones it does not
know. None means "not applicable to this row" (no reference answer, or a row of another verifier).

Callers (`score_tasks`, evaluation, task-set validation, self-repair) only ever go through this interface, so a
new verifier is one module: subclass `Verifier`, set `name`, and `register_verifier(YourVerifier())`. A
package outside this repository registers its verifiers through the `posttrain.verifiers` entry point group
(training/entry_points.py): a domain is then data (its task rows name the verifier), with no edit here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from training.entry_points import VERIFIER_GROUP, load_once, load_verifiers

RewardFn = Callable[..., list[float | None]]


class UnknownVerifier(KeyError):
    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0])


class Verifier:
    """Base class: override `score`; the rest has sensible defaults."""

    name: str = ""
    # evaluation offers a failed completion back to the model with `explain`'s line (self-repair)
    repairable: ClassVar[bool] = False
    # the smallest score that counts as a pass
    pass_threshold: ClassVar[float] = 1.0
    # judges any task (a component of a weighted reward), not only the rows whose `verifier` names it
    any_task: ClassVar[bool] = False
    # the multi-turn environment (training/environments) its tasks play in RL episodes and evaluation's
    # self-repair, unless a config names one for the task's domain; None: single-turn
    environment: ClassVar[str | None] = None
    # the answer-format instruction a chat model is given for its tasks (ChatSettings.from_verifiers)
    instruction: ClassVar[str] = ""

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[float | None]:
        raise NotImplementedError

    def strict(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[float | None]:
        """Default: the score where the completion also has the required format, else 0.0."""
        return [
            s if s is None or self.format_ok(t, c) else 0.0
            for t, c, s in zip(tasks, completions, self.score(tasks, completions, **options))
        ]

    def format_ok(self, task: Any, completion: str) -> bool:
        return bool(completion.strip())

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        return []

    def explain(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[str]:
        scores = self.score(tasks, completions, **options)
        return [
            "" if s is not None and self.passes(s) else ("wrong format" if not self.format_ok(t, c) else "wrong answer")
            for t, c, s in zip(tasks, completions, scores)
        ]

    def passes(self, value: float | None) -> bool:
        return value is not None and value >= self.pass_threshold - 1e-9


class FunctionVerifier(Verifier):
    """A plain TRL-shaped reward function `fn(prompts, completions, **columns)` as a Verifier."""

    def __init__(self, name: str, fn: RewardFn) -> None:
        self.fn = fn
        self.name = name

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[float | None]:
        return self.fn([t.prompt for t in tasks], list(completions), **task_columns(tasks), **options)


VERIFIERS: dict[str, Verifier] = {}
REWARDS: dict[str, RewardFn] = {}


def register_verifier(verifier: Verifier) -> Verifier:
    """Register `verifier` under its name (and its TRL-shaped reward function in REWARDS)."""
    name = verifier.name
    if not name:
        raise ValueError(f"{type(verifier).__name__} has no name")
    old = VERIFIERS.get(name)
    if old is not None and type(old) is not type(verifier):
        raise ValueError(f"verifier {name!r} is already registered to {type(old).__qualname__}")
    VERIFIERS[name] = verifier
    if not isinstance(verifier, FunctionVerifier):
        REWARDS[name] = reward_fn(verifier)
    return verifier


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a plain reward function under `name`; a second, different function under the same name is
    an error. A `Verifier` registered under the same name later takes over scoring and keeps the function."""

    def deco(fn: RewardFn) -> RewardFn:
        old = REWARDS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(
                f"reward {name!r} is already registered to {old.__module__}.{old.__qualname__}; "
                f"refusing to replace it with {fn.__module__}.{fn.__qualname__}"
            )
        REWARDS[name] = fn
        if not isinstance(VERIFIERS.get(name), Verifier) or isinstance(VERIFIERS[name], FunctionVerifier):
            VERIFIERS[name] = FunctionVerifier(name, fn)
        return fn

    return deco


def load_plugins() -> list[str]:
    """Register the verifiers other packages declare (`posttrain.verifiers` entry points), once; returns their
    entry point names. Called on the first lookup rather than on import: a user's module may itself import
    training.rewards or training.environments, which must be whole by then."""
    return load_once(VERIFIER_GROUP, lambda: load_verifiers(register_verifier, Verifier))


def find_verifier(name: str) -> Verifier | None:
    """The verifier registered as `name` (built in or from a package), or None."""
    if name not in VERIFIERS:
        load_plugins()
    return VERIFIERS.get(name)


def verifier_names() -> list[str]:
    """Every verifier name, built in and from installed packages."""
    load_plugins()
    return sorted(VERIFIERS)


def get_verifier(name: str) -> Verifier:
    verifier = find_verifier(name)
    if verifier is None:
        raise UnknownVerifier(f"unknown verifier {name!r}; known verifiers: {', '.join(verifier_names())}")
    return verifier


def get_reward(name: str) -> RewardFn:
    if name not in REWARDS:
        get_verifier(name)  # the error names every known verifier
    return REWARDS[name]


class _Row:
    """A task rebuilt from TRL-style columns (what a reward function receives)."""

    __slots__ = ("id", "prompt", "verifier", "answer", "tests", "metadata", "reference", "domain")

    def __init__(self, **kw: Any) -> None:
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def reward_fn(verifier: Verifier) -> RewardFn:
    """The verifier as a TRL-shaped reward function: rows whose `verifier` column names another get None."""
    name = verifier.name

    def fn(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float | None]:
        n = len(completions)

        def col(key: str) -> list[Any]:
            value = columns.get(key)
            return list(value) if value is not None else [None] * n

        names = col("verifier")
        rows = [
            _Row(
                prompt=p,
                **{k: col(k)[i] for k in ("id", "verifier", "answer", "tests", "metadata", "reference", "domain")},
            )
            for i, p in enumerate(prompts)
        ]
        mine = [i for i in range(n) if verifier.any_task or names[i] in (None, name)]
        options = {k: v for k, v in columns.items() if k not in _Row.__slots__}
        out: list[float | None] = [None] * n
        for i, s in zip(mine, verifier.score([rows[i] for i in mine], [completions[i] for i in mine], **options)):
            out[i] = s
        return out

    fn.__name__ = fn.__qualname__ = f"{name}_reward"
    return fn


def task_columns(tasks: Sequence[Any]) -> dict[str, list[Any]]:
    """The `**columns` a reward function receives, built from Task records."""
    return {
        "id": [t.id for t in tasks],
        "verifier": [t.verifier for t in tasks],
        "answer": [t.answer for t in tasks],
        "tests": [t.tests for t in tasks],
        "metadata": [t.metadata for t in tasks],
        "reference": [getattr(t, "reference", None) for t in tasks],
    }
