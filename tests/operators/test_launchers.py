"""Launchers: a real local process group; the Docker launcher against a spec'd mock client."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from operators.launchers.base import StageTimeout
from operators.launchers.docker import DockerLauncher
from operators.launchers.local import LocalProcessLauncher
from operators.spec import StageSpec

CHILD = """
import os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
print("started", flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_local_streams_lines_and_returns_exit_code() -> None:
    lines: list[str] = []
    argv = [sys.executable, "-c", "print('one'); print('POSTTRAIN_RESULT {}'); import sys; sys.exit(3)"]
    rc = LocalProcessLauncher().run(StageSpec("sft"), argv, {"X": "1"}, lines.append)
    assert rc == 3 and lines == ["one", "POSTTRAIN_RESULT {}"]


def test_local_passes_environment() -> None:
    lines: list[str] = []
    argv = [sys.executable, "-c", "import os; print(os.environ['POSTTRAIN_TEST_VALUE'])"]
    LocalProcessLauncher().run(StageSpec("sft"), argv, {"POSTTRAIN_TEST_VALUE": "seen"}, lines.append)
    assert lines == ["seen"]


def test_local_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    launcher = LocalProcessLauncher(grace_s=2)
    pidfile = tmp_path / "grandchild.pid"
    lines: list[str] = []
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(
            rc=launcher.run(StageSpec("sft"), [sys.executable, "-c", CHILD, str(pidfile)], {}, lines.append)
        )
    )
    t.start()
    deadline = time.monotonic() + 20
    while not (lines and pidfile.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert _alive(grandchild)
    launcher.stop()
    t.join(timeout=10)
    assert not t.is_alive() and result["rc"] != 0
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "on_kill must reach the stage's children too"


def test_local_timeout_stops_stage() -> None:
    with pytest.raises(StageTimeout, match="timeout of 1s"):
        LocalProcessLauncher(grace_s=1).run(
            StageSpec("sft", timeout_s=1), [sys.executable, "-c", "import time; time.sleep(60)"], {}, print
        )


docker = pytest.importorskip("docker")


@pytest.fixture
def client():
    client = mock.Mock(spec=docker.DockerClient)
    client.containers = mock.Mock(spec=docker.models.containers.ContainerCollection)
    container = mock.Mock(spec=docker.models.containers.Container)
    container.logs.return_value = iter([b"hello\nPOSTTRAIN_RES", b'ULT {"a": 1}\n', b"tail"])
    container.wait.return_value = {"StatusCode": 0}
    client.containers.run.return_value = container
    return client


def test_docker_requests_gpus_limits_and_streams(client) -> None:
    spec = StageSpec(
        "rl-round",
        args=("--round", "1"),
        launcher="docker",
        image="posttrain-train:1",
        gpus=2,
        memory="32g",
        cpus=8,
        pids=4096,
    )
    lines: list[str] = []
    rc = DockerLauncher(client).run(spec, ["posttrain", "rl-round"], {"AWS_ACCESS_KEY_ID": "k"}, lines.append)
    assert rc == 0
    assert lines == ["hello", 'POSTTRAIN_RESULT {"a": 1}', "tail"]  # chunks re-assembled into lines
    kwargs = client.containers.run.call_args.kwargs
    assert kwargs["image"] == "posttrain-train:1" and kwargs["command"] == ["posttrain", "rl-round"]
    (request,) = kwargs["device_requests"]
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert kwargs["mem_limit"] == "32g" and kwargs["nano_cpus"] == 8_000_000_000 and kwargs["pids_limit"] == 4096
    assert kwargs["init"] is True  # signals reach the stage (tests/operators/test_docker_launcher_real.py)
    assert kwargs["environment"] == {"AWS_ACCESS_KEY_ID": "k"} and kwargs["detach"] is True
    client.containers.run.return_value.remove.assert_called_with(force=True)


def test_docker_without_gpus_requests_none(client) -> None:
    DockerLauncher(client).run(StageSpec("evaluate", launcher="docker"), ["posttrain"], {}, lambda _: None)
    assert not {"device_requests", "pids_limit"} & set(client.containers.run.call_args.kwargs)


def test_docker_stop_stops_the_container(client) -> None:
    launcher = DockerLauncher(client, grace_s=7)
    launcher.run(StageSpec("sft", launcher="docker"), ["posttrain"], {}, lambda _: None)
    launcher.stop()
    container = client.containers.run.return_value
    container.stop.assert_called_once_with(timeout=7)


def test_docker_nonzero_exit_code(client) -> None:
    client.containers.run.return_value.wait.return_value = {"StatusCode": 137}
    assert DockerLauncher(client).run(StageSpec("sft", launcher="docker"), ["x"], {}, lambda _: None) == 137


def test_docker_from_env_joins_the_network_and_mounts_the_cache(client) -> None:
    from operators.launchers.docker import from_env

    launcher = from_env(
        client,
        {
            "POSTTRAIN_DOCKER_NETWORK": "posttrain",
            "POSTTRAIN_DOCKER_VOLUMES": "posttrain-hf-cache:/cache, data:/data:ro",
        },
    )
    launcher.run(StageSpec("sft", launcher="docker"), ["posttrain"], {}, lambda _: None)
    kwargs = client.containers.run.call_args.kwargs
    assert kwargs["network"] == "posttrain"
    assert kwargs["volumes"] == {
        "posttrain-hf-cache": {"bind": "/cache", "mode": "rw"},
        "data": {"bind": "/data", "mode": "ro"},
    }


def test_docker_from_env_defaults_and_rejects_bad_volumes(client) -> None:
    from operators.launchers.docker import from_env, parse_volumes

    launcher = from_env(client, {})
    assert launcher.network is None and launcher.volumes == {}
    with pytest.raises(ValueError, match="name:/container/path"):
        parse_volumes("posttrain-hf-cache")


def test_spec_validates_launcher() -> None:
    with pytest.raises(ValueError, match="not one of local, docker, kubernetes"):
        StageSpec("sft", launcher="slurm")


def test_local_starts_torchrun_with_nproc_per_node_processes() -> None:
    """The real runtime: torchrun started by the local launcher runs `posttrain sft --help` in 2 processes."""
    spec = StageSpec("sft", args=("--help",), nproc_per_node=2)
    argv = spec.argv("", None)
    assert argv[:5] == ["torchrun", "--nproc-per-node", "2", "--standalone", "-m"]
    lines: list[str] = []
    rc = LocalProcessLauncher().run(spec, argv, {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}, lines.append)
    assert rc == 0, lines[-20:]
    assert sum(line.startswith("usage: posttrain sft") for line in lines) == 2, lines[:20]


def test_spec_rejects_several_nodes_outside_kubernetes() -> None:
    with pytest.raises(ValueError, match="kubernetes"):
        StageSpec("sft", nnodes=2)
    with pytest.raises(ValueError, match=">= 1"):
        StageSpec("sft", nproc_per_node=0)
    assert StageSpec("gate").argv("s3://b/r", None) == ["posttrain", "gate", "--run", "s3://b/r"]


def test_torchrun_stages_restart_a_lost_rank_as_configured() -> None:
    """--max-restarts reaches torchrun (one node and several); the DAGs' training stages get the deployment's
    POSTTRAIN_MAX_RESTARTS when they run over several processes, none in one process. The restart itself is
    tests/training/modeling/test_distributed.py's: rank 1 of a 2-rank FSDP round SIGKILLed, the round resumed."""
    import operators.pipeline as pipeline
    from operators.spec import torchrun_env

    one = StageSpec("rl-round", nproc_per_node=2, max_restarts=3).argv("s3://b/r", None)
    assert one[:7] == ["torchrun", "--nproc-per-node", "2", "--max-restarts", "3", "--standalone", "-m"]
    nodes = StageSpec("sft", launcher="kubernetes", nproc_per_node=8, nnodes=2, max_restarts=1).argv("", None)
    assert nodes[3:5] == ["--max-restarts", "1"] and "--rdzv-backend" in nodes
    assert "--max-restarts" not in StageSpec("sft", nproc_per_node=2).argv("", None)
    assert torchrun_env(StageSpec("sft", nproc_per_node=2, max_restarts=1)) == {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"
    }
    assert torchrun_env(StageSpec("sft", nproc_per_node=2)) == torchrun_env(StageSpec("sft", max_restarts=1)) == {}
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        StageSpec("sft", max_restarts=-1)
    with mock.patch.object(pipeline, "NPROC_PER_NODE", 4), mock.patch.object(pipeline, "MAX_RESTARTS", 5):
        assert pipeline.spec("rl-round").max_restarts == 5 and pipeline.spec("gate").max_restarts == 0
    with mock.patch.object(pipeline, "NPROC_PER_NODE", 1), mock.patch.object(pipeline, "MAX_RESTARTS", 5):
        assert pipeline.spec("rl-round").max_restarts == 0  # one process: nothing for torchrun to restart
