"""Environments for multi-turn episodes: the model answers, the environment replies as the next user turn.

    env = make_environment("code_repair", task)   # or environment_for(task, {"code": "code_repair"})
    messages = env.reset(task)                    # the episode's opening messages
    step = env.step(completion_text)              # Step(observation, done, info)

base.py         the interface (Environment, Step), the registry, and `step_all` (one batched call per class)
code_repair.py  runs a code task's visible tests in the sandbox; replies with the failure, naming what was
                expected; done when they pass
calculator.py   math with a calculator tool: `calc(<expression>)` in an answer is evaluated and the value
                returned; done when an answer calls no tool
planting.py     planted wrong first answers (and mirrored tasks) that make an RL group practise repair
episodes.py     runs G episodes per task through any rollout engine, up to T turns, and lays each out as one
                completion (model tokens and environment tokens, the latter masked from the loss)

A task plays the environment its config names for its domain, else its verifier's own (`environment_name`).
Other packages add environments through the `posttrain.environments` entry point group
(training/entry_points.py).
"""

from training.environments.base import (
    ENVIRONMENTS,
    Environment,
    Step,
    environment_for,
    environment_name,
    environment_names,
    load_plugins,
    make_environment,
    step_all,
)
from training.environments.calculator import CalculatorEnv
from training.environments.code_repair import CodeRepairEnv

__all__ = [
    "ENVIRONMENTS",
    "CalculatorEnv",
    "CodeRepairEnv",
    "Environment",
    "Step",
    "environment_for",
    "environment_name",
    "environment_names",
    "load_plugins",
    "make_environment",
    "step_all",
]
