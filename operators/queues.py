"""Which executor queue each task goes to: the one place that maps a stage to a kind of worker.

Under the CeleryExecutor (the local stack's `--executor celery`, and compose) workers subscribe per queue, so a
stage lands only on a worker that can run it:

- `gpu` (env POSTTRAIN_QUEUE_GPU): `sft`, `rl-round` (they train) and `evaluate` (it generates with the model).
- `sandbox` (env POSTTRAIN_QUEUE_SANDBOX): `score` and `sandbox`, stages that run model-written code without a
  model (none of today's DAGs wires one in; a sandbox host's worker subscribes to it).
- `cpu` (env POSTTRAIN_QUEUE_CPU): everything else: `build-taskset`, `adopt`, `latest`, `gate`, `promote` and
  the control tasks (the approval, the gate's branch, the end of tracking). Also Airflow's default queue in the
  stack and in compose, so a task that names no queue still finds a worker.

`rl-round` and `evaluate` also run code rewards in the sandbox, but they need the GPU for the model, so they are
`gpu` work; their sandbox load is capped by pools, not queues. Queues choose *where* a task runs; pools (`gpu`,
`sandbox`) still cap *how many* run at once, whatever the executor. Under the LocalExecutor (the default local
stack) the queue is ignored and every task runs on the scheduler's host.

The names are read from the environment when the DAG files are parsed, so the dag-processor and the workers
must see the same values (compose and the local stack pass them to every Airflow component).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

GPU, CPU, SANDBOX = "gpu", "cpu", "sandbox"
# The kind of worker each `posttrain` subcommand needs; a command not listed is cpu work.
STAGE_KINDS: dict[str, str] = {
    "sft": GPU,
    "rl-round": GPU,
    "evaluate": GPU,
    "score": SANDBOX,
    "sandbox": SANDBOX,
}
ENV_NAMES = {GPU: "POSTTRAIN_QUEUE_GPU", CPU: "POSTTRAIN_QUEUE_CPU", SANDBOX: "POSTTRAIN_QUEUE_SANDBOX"}


@dataclass(frozen=True)
class Queues:
    """The queue name of each kind of worker."""

    gpu: str = GPU
    cpu: str = CPU
    sandbox: str = SANDBOX

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Queues:
        env = os.environ if env is None else env
        names = {kind: env.get(var, "").strip() or kind for kind, var in ENV_NAMES.items()}
        return cls(**names)

    def of_kind(self, kind: str) -> str:
        return {GPU: self.gpu, CPU: self.cpu, SANDBOX: self.sandbox}[kind]

    def for_command(self, command: str) -> str:
        """The queue of the stage that runs `posttrain <command>`."""
        return self.of_kind(STAGE_KINDS.get(command, CPU))


QUEUES = Queues.from_env()
