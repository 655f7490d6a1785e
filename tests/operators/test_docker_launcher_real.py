"""Stages in real containers: the Docker launcher against a real engine (a private dockerd, tests/docker_engine.py).

The stage image is a skeleton root filesystem (no registry) with the host's /usr, the project, its virtualenv
and its interpreter bind-mounted read-only through POSTTRAIN_DOCKER_VOLUMES, exactly as a deployment mounts the model
cache. Containers join a user-defined bridge network (POSTTRAIN_DOCKER_NETWORK) and reach the session's
embedded stack (S3 and MLflow on the host's 127.0.0.1) at the network's gateway address through a TCP relay;
their S3 and MLflow settings come from Airflow connections (AIRFLOW_CONN_*), as the operator builds them.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operators.spec import StageSpec
from training.stage import RESULT_PREFIX, parse_result

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DOCKER_CONN = "posttrain_test_docker"
TASKSET = {"counts": {"math": 200, "code": 40, "extraction": 40}}
# A one-layer model: each step takes milliseconds, so the stage's time is its start-up and its uploads.
SFT = {
    "max_steps": 12,
    "batch_size": 4,
    "max_seq_len": 64,
    "vocab_size": 300,
    "checkpoint_every": 4,
    "log_every": 1,
    "warmup_steps": 2,
    "tiny": {"n_layer": 1, "n_embd": 32, "n_head": 2},
}


class Deployment:
    """What a stage container gets here: the image, the network, and the connections the operator reads."""

    def __init__(self, engine: Any, image: str, network: str) -> None:
        self.engine, self.image, self.network = engine, image, network

    def spec(self, command: str, **changes: Any) -> StageSpec:
        import sys

        env = {
            "PATH": f"{sys.prefix}/bin:/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "HOME": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            # MLflow downloads artifacts from presigned URLs on the server's own S3 endpoint, here the host's
            # 127.0.0.1, which a container cannot reach (under compose both use minio:9000); through the
            # server instead. A resumed SFT downloads its sample table to append to it.
            "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "false",
        }
        return StageSpec(command, launcher="docker", image=self.image, env=env, timeout_s=240, **changes)

    def operator(self, spec: StageSpec, run_uri: str, config: dict[str, Any]) -> Any:
        from operators.stage_operator import PosttrainStageOperator

        return PosttrainStageOperator(
            task_id=f"{spec.command}-{uuid.uuid4().hex[:6]}",
            spec=spec,
            run_uri=run_uri,
            config=json.dumps(config),
            docker_conn_id=DOCKER_CONN,
        )


def new_run_uri() -> str:
    return f"s3://posttrain/test-runs/docker-{uuid.uuid4().hex[:10]}"


def launch(op: Any, on_line: Callable[[Any, str], None] = lambda launcher, line: None) -> tuple[int, list[str]]:
    """PosttrainStageOperator.execute up to the exit code: its argv, its launcher (from the deployment's
    environment) and its stage env (from the connections). The XCom links after it need a task instance."""
    argv = op.spec.argv(op.run_uri, op.config)
    launcher = op._launcher = op.make_launcher()
    lines: list[str] = []

    def line(text: str) -> None:
        lines.append(text)
        on_line(launcher, text)

    return launcher.run(op.spec, argv, op.stage_env(), line), lines


@pytest.fixture(scope="module")
def deployment(docker_engine, local_stack) -> Iterator[Deployment]:
    from tests.docker_engine import EngineUnavailable, Relay, base_image, stage_volumes

    t0 = time.monotonic()
    try:
        image = base_image(docker_engine)
    except EngineUnavailable as exc:
        pytest.skip(f"no stage image: {exc}")
    print(f"stage image ready in {time.monotonic() - t0:.1f}s")
    name = f"posttrain-test-{uuid.uuid4().hex[:8]}"
    network = docker_engine.client.networks.create(name, driver="bridge")
    network.reload()
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    relays = {svc: Relay(gateway, local_stack.ports[svc]) for svc in ("s3", "mlflow")}
    s3 = f"http://{gateway}:{relays['s3'].port}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "AIRFLOW_CONN_AWS_DEFAULT",
            json.dumps(
                {
                    "conn_type": "aws",
                    "login": local_stack.client_env()["AWS_ACCESS_KEY_ID"],
                    "password": local_stack.client_env()["AWS_SECRET_ACCESS_KEY"],
                    "extra": {"endpoint_url": s3, "region_name": "us-east-1"},
                }
            ),
        )
        mp.setenv(
            "AIRFLOW_CONN_MLFLOW_DEFAULT",
            json.dumps({"conn_type": "http", "host": gateway, "port": relays["mlflow"].port, "schema": "http"}),
        )
        mp.setenv(
            f"AIRFLOW_CONN_{DOCKER_CONN.upper()}", json.dumps({"conn_type": "docker", "host": docker_engine.host})
        )
        mp.setenv("POSTTRAIN_DOCKER_NETWORK", name)
        mp.setenv("POSTTRAIN_DOCKER_VOLUMES", stage_volumes(REPO))
        try:
            yield Deployment(docker_engine, image, name)
        finally:
            for relay in relays.values():
                relay.close()
            for container in docker_engine.client.containers.list(all=True, filters={"network": name}):
                container.remove(force=True)
            network.remove()


@pytest.fixture(scope="module")
def taskset(deployment, local_stack) -> dict[str, Any]:
    """build-taskset in a container; what `docker inspect` said about that container while it ran."""
    run_uri = new_run_uri()
    op = deployment.operator(deployment.spec("build-taskset", memory="2g", pids=256), run_uri, TASKSET)
    seen: dict[str, Any] = {}

    def inspect(launcher: Any, _line: str) -> None:
        if not seen:
            seen.update(deployment.engine.client.api.inspect_container(launcher.container.id))

    t0 = time.monotonic()
    rc, lines = launch(op, inspect)
    print(f"build-taskset in a container: {time.monotonic() - t0:.1f}s")
    return {"run_uri": run_uri, "rc": rc, "lines": lines, "inspect": seen}


def test_stage_runs_in_a_container_on_the_network_with_limits_and_connection_env(
    deployment, taskset, local_stack
) -> None:
    from mlflow.tracking import MlflowClient

    from training import storage

    assert taskset["rc"] == 0, "\n".join(taskset["lines"][-30:])
    result = parse_result([line for line in taskset["lines"] if line.startswith(RESULT_PREFIX)])
    assert result is not None and result["manifest_uri"] == f"{taskset['run_uri']}/taskset/manifest.json"
    manifest = storage.require_manifest(f"{taskset['run_uri']}/taskset")  # read on the host, from the real S3
    assert {"train.parquet", "holdout.parquet", "report.json"} <= set(manifest.files)
    run = MlflowClient(local_stack.mlflow_url).get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"

    info = taskset["inspect"]
    host = info["HostConfig"]
    assert host["Memory"] == 2 * 1024**3 and host["PidsLimit"] == 256
    assert host["NetworkMode"] == deployment.network
    assert list(info["NetworkSettings"]["Networks"]) == [deployment.network]
    env = dict(item.split("=", 1) for item in info["Config"]["Env"])
    connection = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
    assert env["AWS_ENDPOINT_URL_S3"] == connection["extra"]["endpoint_url"] != local_stack.s3_url
    assert env["MLFLOW_TRACKING_URI"].startswith("http://") and "127.0.0.1" not in env["MLFLOW_TRACKING_URI"]
    assert info["Config"]["Labels"]["posttrain.stage"] == "build-taskset"
    # The launcher removes the container once the stage has ended.
    assert not deployment.engine.client.containers.list(all=True, filters={"id": info["Id"]})


def test_gpus_are_requested_as_device_requests(deployment) -> None:
    """No GPU here: the container is created, not started, and the engine's record of the request is read back."""
    from operators.launchers.docker import from_env
    from plugins.hooks import DockerEngineHook

    client = DockerEngineHook(DOCKER_CONN).client
    spec = deployment.spec("sft", gpus=1, nproc_per_node=2)
    kwargs = from_env(client, os.environ).container_kwargs(spec, ["posttrain", "sft"], {})
    kwargs.pop("detach")
    container = client.containers.create(**kwargs)
    try:
        requests = client.api.inspect_container(container.id)["HostConfig"]["DeviceRequests"]
        assert [(r["Count"], r["Capabilities"]) for r in requests] == [(2, [["gpu"]])]  # one per torchrun rank
    finally:
        container.remove(force=True)


def _sft_run(taskset: dict[str, Any]) -> str:
    """A fresh run holding the module's task set (a verified copy), so each SFT test starts from nothing."""
    from training import cli

    run_uri = new_run_uri()
    assert taskset["rc"] == 0
    assert cli.main(["adopt", "--source", f"{taskset['run_uri']}/taskset", "--as", "taskset", "--run", run_uri]) == 0
    return run_uri


def test_on_kill_stops_the_container(deployment) -> None:
    """Stopped as soon as the stage has said anything: any running stage will do, so the cheapest one."""
    op = deployment.operator(deployment.spec("build-taskset"), new_run_uri(), TASKSET)
    killed: dict[str, Any] = {}

    def on_kill() -> None:
        t0 = time.monotonic()
        op.on_kill()
        killed["took"] = time.monotonic() - t0

    def kill_when_running(launcher: Any, line: str) -> None:
        if not killed:
            killed["id"] = launcher.container.id
            # Airflow calls on_kill from another thread (the task runner's signal handler) while execute runs.
            killed["thread"] = threading.Thread(target=on_kill)
            killed["thread"].start()

    rc, lines = launch(op, kill_when_running)
    assert killed, "\n".join(lines[-30:])
    killed["thread"].join(timeout=60)
    # 143 = 128 + SIGTERM: `docker stop` reached the stage itself (through docker-init), no SIGKILL was needed.
    assert rc == 143 and RESULT_PREFIX not in "\n".join(lines), "\n".join(lines[-30:])
    assert killed["took"] < op._launcher.grace_s
    assert not deployment.engine.client.containers.list(all=True, filters={"id": killed["id"]})
    print(f"on_kill: stage exit {rc}, on_kill returned in {killed['took']:.1f}s, container removed")


def test_container_killed_mid_stage_then_retried_resumes(deployment, taskset) -> None:
    from training import storage

    run_uri = _sft_run(taskset)
    op = deployment.operator(deployment.spec("sft"), run_uri, SFT)
    checkpoints: list[int] = []

    def docker_kill_after_first_checkpoint(launcher: Any, line: str) -> None:
        if "[sft] checkpoint step" in line:
            checkpoints.append(int(line.split("checkpoint step")[1].split()[0]))
            if len(checkpoints) == 1:
                deployment.engine.docker("kill", launcher.container.id)  # SIGKILL from the engine

    rc, lines = launch(op, docker_kill_after_first_checkpoint)
    assert rc == 137 and checkpoints, "\n".join(lines[-30:])
    assert storage.read_manifest(f"{run_uri}/sft") is None  # killed: not complete
    saved = [step for step, _ in storage.list_complete_checkpoints(f"{run_uri}/sft")]
    assert saved and saved[-1] == checkpoints[-1]

    rc, lines = launch(op)  # Airflow's retry: the same command again
    assert rc == 0, "\n".join(lines[-30:])
    result = parse_result([line for line in lines if line.startswith(RESULT_PREFIX)])
    assert result is not None
    assert result["summary"]["resumed_from"] == saved[-1] and result["summary"]["steps"] == SFT["max_steps"]
    assert storage.read_manifest(f"{run_uri}/sft") is not None
