"""What the whole-stack tests share: a short `post_training` run's per-stage override, and an embedded stack
started for a test module with its environment put back afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.local.stack import Stack, free_port

# A post_training run cut to what a 2-core machine runs in a few minutes: these tests check where and how the
# stages run (UI, workers, crashes), not what the model learns. An 8-step model passes no holdout task, which
# the gate's floor would block, and the small evaluation is below the gate's default minimum evidence: the
# gate is opened so the run reaches `promote`.
SHORT_RUN: dict[str, dict[str, Any]] = {
    "taskset": {"counts": {"math": 120, "code": 60, "extraction": 60, "instruction": 60}},
    "sft": {"max_steps": 8},
    "rl_round": {"steps": 1, "prompts_per_step": 4, "holdout_per_domain": 6},
    "evaluate": {"max_tasks_per_domain": 8, "n_samples": 1, "ks": [1], "long_context_tasks": 0},
    "gate": {"tolerance": 1, "min_samples": 5, "require_any_pass": False},
}


def short_run(**changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """SHORT_RUN with some stages' fields changed, e.g. short_run(sft={"max_steps": 4})."""
    return {stage: {**SHORT_RUN.get(stage, {}), **changes.get(stage, {})} for stage in {*SHORT_RUN, *changes}}


@contextmanager
def running_stack(
    state: Path,
    *,
    env: Mapping[str, str | None] = (),
    services: tuple[str, ...] | None = None,
    ports: tuple[str, ...] = ("s3", "mlflow", "airflow"),
    **stack_args: Any,
) -> Iterator[Stack]:
    """A Stack on free ports under `state`, up (all services, or `services`) with `env` applied first (None
    removes a variable), its client settings in os.environ while it runs; stopped and the environment restored
    on the way out."""
    saved = dict(os.environ)
    for key, value in dict(env).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    stack = Stack(state, ports={name: free_port() for name in ports}, **stack_args)
    try:
        if services is None:
            stack.up(quiet=True)
        else:
            stack.up(services, quiet=True)
        os.environ.update(stack.client_env())
        yield stack
    finally:
        stack.down(quiet=True)
        os.environ.clear()
        os.environ.update(saved)
