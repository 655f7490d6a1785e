"""Planted first answers for multi-turn RL rounds (`GRPOConfig.planted_share`, `planted_mirrors`).

A planted group starts its episodes from a wrong first answer the environment rejects, so the round practises
repair even where the model's own first attempts already pass; a mirrored plant plays the task's mirror (the
same prompt, with tests that ask for what the planted near miss returns) from the task's reference instead.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

from training.environments.base import Environment, environment_for, step_all
from training.tasksets.schema import Task


def planted_attempts(
    tasks: list[Task], environments: dict[str, str], share: float, rng: random.Random
) -> list[str | None] | None:
    """For about `share` of the tasks whose environment can plant a first answer (`planted_attempt`), one that
    its environment does not accept (a planted answer that passed would leave the model nothing to answer);
    None for the rest. None when nothing is planted."""
    if share <= 0:
        return None
    out: list[str | None] = [None] * len(tasks)
    for i, task in enumerate(tasks):
        plant = getattr(environment_for(task, environments), "planted_attempt", None)
        if plant is not None and rng.random() < share:
            out[i] = plant(task, rng)
    return rejected(tasks, out, environments)


def mirrored_plants(
    tasks: list[Task], planted: list[str | None], environments: dict[str, str]
) -> tuple[list[Task], list[str | None]]:
    """`planted_mirrors`: each planted task whose environment can mirror it (`mirror_tasks(tasks, programs)`)
    swapped for the mirror built from its planted answer, and that answer swapped for the task's reference (the
    mirror's first attempt, kept only where the mirror's environment rejects it; else the plant stays as it
    was). The tasks and the first answers to play."""
    played, answers = list(tasks), list(planted)
    by_mirror: dict[Callable[..., list[Task | None]], list[int]] = defaultdict(list)  # one batch per function
    for i, (task, answer) in enumerate(zip(tasks, planted)):
        mirror = getattr(environment_for(task, environments), "mirror_tasks", None)
        if answer is not None and task.reference and mirror is not None:
            by_mirror[mirror].append(i)
    swaps: dict[int, Task] = {}
    for mirror, rows in by_mirror.items():
        mirrors = mirror([tasks[i] for i in rows], [planted[i] for i in rows])
        swaps.update({i: m for i, m in zip(rows, mirrors) if m is not None})
    rows = sorted(swaps)
    firsts = rejected([swaps[i] for i in rows], [tasks[i].reference for i in rows], environments)
    for i, first in zip(rows, firsts):
        if first is not None:
            played[i], answers[i] = swaps[i], first
    return played, answers


def rejected(tasks: list[Task], answers: list[str | None], environments: dict[str, str]) -> list[str | None]:
    """Each answer its task's environment does not accept as a first answer (one batch per environment type),
    None where it does, or where there is no answer."""
    rows: list[int] = []
    envs: list[Environment] = []
    given: list[str] = []
    for i, (task, answer) in enumerate(zip(tasks, answers)):
        env = environment_for(task, environments)
        if answer is not None and env is not None:
            env.reset(task)
            rows.append(i)
            envs.append(env)
            given.append(answer)
    out: list[str | None] = [None] * len(tasks)
    for i, answer, st in zip(rows, given, step_all(envs, given) if envs else []):
        if not st.done and st.observation is not None:
            out[i] = answer
    return out
