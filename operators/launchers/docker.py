"""Run a stage in a container (the production path: the train image has CUDA, vLLM and the project)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from operators.launchers.base import StageTimeout
from operators.spec import StageSpec


def parse_volumes(text: str) -> dict[str, dict[str, str]]:
    """`POSTTRAIN_DOCKER_VOLUMES` ("name:/path[:mode]", comma-separated, as `docker run -v`) in the SDK's form.
    compose sets it so every stage shares the Hugging Face cache volume instead of downloading the model again."""
    volumes: dict[str, dict[str, str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        source, _, rest = item.partition(":")
        bind, _, mode = rest.partition(":")
        if not source or not bind.startswith("/"):
            raise ValueError(f"POSTTRAIN_DOCKER_VOLUMES entry {item!r}: use name:/container/path[:ro|rw]")
        volumes[source] = {"bind": bind, "mode": mode or "rw"}
    return volumes


def from_env(client: Any, environ: Mapping[str, str]) -> DockerLauncher:
    """The launcher as the deployment configures it: POSTTRAIN_DOCKER_NETWORK (the compose network, so stages
    reach minio and mlflow by name) and POSTTRAIN_DOCKER_VOLUMES."""
    return DockerLauncher(
        client,
        network=environ.get("POSTTRAIN_DOCKER_NETWORK") or None,
        volumes=parse_volumes(environ.get("POSTTRAIN_DOCKER_VOLUMES", "")),
    )


class DockerLauncher:
    """`client` is a docker SDK `DockerClient` (from the DockerEngineHook in plugins/, or a test double)."""

    def __init__(
        self,
        client: Any,
        grace_s: int = 10,
        network: str | None = None,
        volumes: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.client = client
        self.grace_s = grace_s
        self.network = network
        self.volumes = volumes or {}
        self.container: Any = None
        self._lock = threading.Lock()

    def container_kwargs(self, spec: StageSpec, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        from docker.types import DeviceRequest

        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": argv,
            "environment": env,
            "detach": True,
            "labels": {"posttrain.stage": spec.command},
            "volumes": self.volumes,
            "shm_size": "2g",  # torch dataloaders and NCCL need more than docker's 64 MB default
            # docker-init as PID 1: the kernel shields a namespace's PID 1 from signals it has no handler for, so
            # a stage running as PID 1 would ignore `docker stop`'s SIGTERM (on_kill then waited out grace_s for
            # the SIGKILL) and its own SIGKILL fault hook; init forwards signals and reaps the stage's children.
            "init": True,
        }
        if spec.gpus:  # under torchrun, one GPU per process at least
            count = max(spec.gpus, spec.nproc_per_node)
            kwargs["device_requests"] = [DeviceRequest(count=count, capabilities=[["gpu"]])]
        if spec.memory:
            kwargs["mem_limit"] = spec.memory
        if spec.cpus:
            kwargs["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.pids:
            kwargs["pids_limit"] = spec.pids
        if self.network:
            kwargs["network"] = self.network
        return kwargs

    def run(self, spec: StageSpec, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> int:
        with self._lock:
            self.container = self.client.containers.run(**self.container_kwargs(spec, argv, env))
        container = self.container
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            self.stop()

        timer = threading.Timer(spec.timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            pending = ""
            for chunk in container.logs(stream=True, follow=True):
                pending += chunk.decode("utf-8", errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    on_line(line)
            if pending:
                on_line(pending)
            status = container.wait()
        finally:
            timer.cancel()
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already removed by stop()
                pass
        if timed_out.is_set():
            raise StageTimeout(f"stage {spec.command} exceeded its timeout of {spec.timeout_s}s; container stopped")
        return int(status.get("StatusCode", 1))

    def stop(self) -> None:
        with self._lock:
            container = self.container
        if container is None:
            return
        try:
            container.stop(timeout=self.grace_s)
        finally:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - stop may already have removed an auto-remove container
                pass
