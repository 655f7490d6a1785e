"""The environment interface: reset(task) -> opening messages; step(completion) -> Step.

An environment holds one episode's state (a new one per episode). Tool results come back as plain text that
the episode runner renders as the next user turn through the model's chat template, so any tool (a sandbox, a
calculator, a Python REPL, a retrieval stub) plugs in without touching the trainer. `step_all` steps many
environments at once, through a class's `step_batch` when it has one (code repair sends every program of a
turn to the sandbox as one batch), else one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from training.entry_points import ENVIRONMENT_GROUP, load_environments, load_once
from training.rewards import find_verifier
from training.tasksets.schema import Task


@dataclass
class Step:
    """What the environment says after one model turn.

    observation: the reply, shown to the model as the next user turn; None when there is nothing to say.
    done:        the episode is over (the task is solved as far as the environment can tell, or the answer
                 called no tool); the episode runner also ends it after its last turn.
    info:        for logs and tests (e.g. the sandbox status and detail); never shown to the model.
    """

    observation: str | None
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    name: str

    def reset(self, task: Task) -> list[dict[str, str]]:
        """The opening messages ({"role", "content"}); the first user message gets the domain's instruction."""
        ...

    def step(self, completion: str) -> Step: ...


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    def add(cls: Callable[..., Environment]) -> Callable[..., Environment]:
        ENVIRONMENTS[name] = cls
        return cls

    return add


def load_plugins() -> list[str]:
    """Register the environments other packages declare (`posttrain.environments` entry points), once, on the
    first lookup (as training.rewards does for verifiers); returns their entry point names."""
    return load_once(ENVIRONMENT_GROUP, lambda: load_environments(ENVIRONMENTS))


def environment_names() -> list[str]:
    """Every environment name, built in and from installed packages."""
    load_plugins()
    return sorted(ENVIRONMENTS)


def make_environment(name: str, task: Task, **options: Any) -> Environment:
    if name not in ENVIRONMENTS:
        load_plugins()
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(environment_names())}")
    return ENVIRONMENTS[name](task, **options)


def environment_name(task: Task, by_domain: dict[str, str]) -> str | None:
    """The environment a task plays: the one `by_domain` names for its domain ("" = none: single-turn), else
    its verifier's own (`Verifier.environment`; code: "code_repair"), so a domain a user adds gets its
    verifier's environment without a setting naming the domain."""
    if task.domain in by_domain:
        return by_domain[task.domain] or None
    return getattr(find_verifier(task.verifier), "environment", None)


def environment_for(task: Task, by_domain: dict[str, str], **options: Any) -> Environment | None:
    """The environment `environment_name` picks for the task (None: the task stays single-turn)."""
    name = environment_name(task, by_domain)
    return make_environment(name, task, **options) if name else None


def step_all(envs: Sequence[Environment], completions: Sequence[str]) -> list[Step]:
    """Each environment stepped with its completion (order kept); a class's `step_batch(envs, completions)`
    handles all of its instances in one call."""
    out: list[Step | None] = [None] * len(envs)
    by_class: dict[type, list[int]] = {}
    for i, env in enumerate(envs):
        by_class.setdefault(type(env), []).append(i)
    for cls, idx in by_class.items():
        batch = getattr(cls, "step_batch", None)
        steps = (
            batch([envs[i] for i in idx], [completions[i] for i in idx])
            if batch is not None
            else [envs[i].step(completions[i]) for i in idx]
        )
        for i, s in zip(idx, steps):
            out[i] = s
    return [s for s in out if s is not None]
