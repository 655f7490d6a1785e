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
    pids:      container process limit (docker's --pids-limit), so a runaway stage (leaked dataloader or
               sandbox workers) cannot exhaust the host's pids; None = the engine's default. Docker only:
               Kubernetes sets it per node (the kubelet's podPidsLimit), not per pod.
    timeout_s: wall-clock limit for the stage; the launcher stops it when exceeded.
    env:       extra non-secret environment for the stage.
    nproc_per_node: processes per node; > 1 (or nnodes > 1) starts the stage under torchrun, one process per
               GPU (DDP or FSDP as the stage's `parallel` config says). Only `sft` and `rl-round` train
               over several processes; other stages ignore the extra ranks' absence.
    nnodes:    nodes; > 1 only on Kubernetes, as a PyTorchJob (operators/launchers/kubernetes.py).
    rdzv_port: the rendezvous port of a multi-node run (rank 0's pod serves it).
    max_restarts: under torchrun, how many times a failed rank restarts the stage's processes (torchrun's
               elastic agent ends every rank and starts them again, on every node); they resume from the
               stage's last checkpoint. Past that the stage fails and Airflow's retries take over.
    """

    command: str
    args: tuple[str, ...] = ()
    launcher: str = "local"
    image: str = "posttrain-train:latest"
    gpus: int = 0
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    timeout_s: int = 6 * 3600
    env: dict[str, str] = field(default_factory=dict)
    nproc_per_node: int = 1
    nnodes: int = 1
    rdzv_port: int = 29500
    max_restarts: int = 0

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError(f"nproc_per_node and nnodes must be >= 1, got {self.nproc_per_node}, {self.nnodes}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.nnodes > 1 and self.launcher != "kubernetes":
            raise ValueError(f"nnodes={self.nnodes}: several nodes need the kubernetes launcher (a PyTorchJob)")

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node > 1 or self.nnodes > 1

    def with_(self, **changes) -> StageSpec:
        return replace(self, **changes)

    def argv(self, run_uri: str, config: str | None) -> list[str]:
        out = ["posttrain", self.command, *self.args]
        if run_uri:
            out += ["--run", run_uri]
        if config:
            out += ["--config", config]
        return torchrun_argv(self, out) if self.distributed else out


def torchrun_argv(spec: StageSpec, argv: list[str]) -> list[str]:
    """`posttrain <stage> ...` under torchrun, with `--max-restarts` when the spec allows restarts. One node:
    `--standalone` (a private rendezvous on localhost).
    Several nodes: c10d rendezvous at $(MASTER_ADDR):rdzv_port, which the PyTorchJob sets on every pod.
    `--` ends torchrun's options: without it torchrun's parser takes `--run` for its own `--run-path`."""
    head = ["torchrun", "--nproc-per-node", str(spec.nproc_per_node)]
    if spec.max_restarts:
        head += ["--max-restarts", str(spec.max_restarts)]
    if spec.nnodes == 1:
        head += ["--standalone"]
    else:
        head += [
            "--nnodes",
            str(spec.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"$(MASTER_ADDR):{spec.rdzv_port}",
            "--rdzv-id",
            "$(POSTTRAIN_RDZV_ID)",
        ]
    return [*head, "-m", "training.cli", "--", *argv[1:]]


def torchrun_env(spec: StageSpec) -> dict[str, str]:
    """The environment torchrun needs for `spec`. With restarts, the ranks' process group gets a TCP store of
    its own instead of sharing the rendezvous store: the shared store's keys outlive a restart, and a restarted
    rank can read the ended group's addresses and fail to connect (pytorch/pytorch#135712; here gloo's
    connectFullMesh was refused on the first restart)."""
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if spec.distributed and spec.max_restarts else {}
