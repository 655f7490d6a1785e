"""What to run for one stage and on what: the single object a stage operator takes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

LAUNCHERS = ("local", "docker", "kubernetes")


@dataclass(frozen=True)
class StageSpec:
    """How to launch `posttrain <command> ...` for one stage.

    command:   the posttrain subcommand ("build-taskset", "sft", "rl-round", ...).
    args:      extra CLI arguments (e.g. ["--round", "2"]); --run and --config are added by the operator.
    launcher:  "local" (a process on the worker), "docker" (a container, GPUs via device_requests) or
               "kubernetes" (a pod, GPUs as nvidia.com/gpu limits).
    image:     container image for docker and kubernetes.
    gpus:      GPUs to request (0 = none).
    memory:    container memory limit, e.g. "16g"; None = no limit.
    cpus:      container CPU limit; None = no limit.
    timeout_s: wall-clock limit for the stage; the launcher stops it when exceeded.
    env:       extra non-secret environment for the stage.
    """

    command: str
    args: tuple[str, ...] = ()
    launcher: str = "local"
    image: str = "posttrain-train:latest"
    gpus: int = 0
    memory: str | None = None
    cpus: float | None = None
    timeout_s: int = 6 * 3600
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")

    def with_(self, **changes) -> StageSpec:
        return replace(self, **changes)

    def argv(self, run_uri: str, config: str | None) -> list[str]:
        out = ["posttrain", self.command, *self.args]
        if run_uri:
            out += ["--run", run_uri]
        if config:
            out += ["--config", config]
        return out
