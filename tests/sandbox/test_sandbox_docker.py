"""The Docker backend. The container entry point is exercised without an engine (the same boot code run by
a local interpreter), then in real containers on the test session's private Docker engine (tests/docker_engine.py):
its registry-free image has no interpreter of its own, so the host's /usr is mounted read-only and the job runs
Debian's /usr/bin/python3."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sandbox import IsolationLevel, Job, Limits, Status, TestCase
from sandbox.docker_backend import BOOT, DockerBackend

JOB = Job(
    "def add(a, b):\n    print('hi')\n    return a + b\n",
    [TestCase("add(1, 2)", 3), TestCase("add(2, 2)", 5)],
    Limits(memory_mb=128, max_procs=16),
)


def test_command_has_the_isolation_flags():
    cmd = DockerBackend(image="python:3.11-slim", volumes=["/opt/py:/opt/py:ro"]).command("c1", JOB)
    joined = " ".join(cmd)
    for flag in (
        "--network none",
        "--read-only",
        "--memory 256m",
        "--memory-swap 256m",
        "--pids-limit 24",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--user 65534:65534",
        "--rm",
        "-i",
    ):
        assert flag in joined, flag
    assert any(a.startswith("/work:rw,nosuid,nodev,size=") for a in cmd)
    assert cmd[cmd.index("--entrypoint") + 1 : cmd.index("--entrypoint") + 3] == ["python3", "python:3.11-slim"]
    assert cmd[cmd.index("--volume") + 1] == "/opt/py:/opt/py:ro"


def test_writable_volumes_are_refused():
    with pytest.raises(ValueError, match="read-only"):
        DockerBackend(volumes=["/tmp:/host-tmp"])


def test_payload_carries_calls_but_never_expected_values():
    payload = DockerBackend().payload(JOB, "ab" * 16).decode()
    assert "add(1, 2)" in payload
    assert '"expected"' not in payload


def test_container_entry_point_runs_locally(tmp_path):
    """The exact boot code and payload a container gets, run by a local interpreter in a scratch dir."""
    backend = DockerBackend()
    nonce = "cd" * 16
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT],
        input=backend.payload(JOB, nonce),
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    v = backend.verdict_from_output(JOB, nonce, proc.returncode, proc.stdout, proc.stderr)
    assert (v.status, v.passed, v.total, v.isolation) == (Status.FAILED, 1, 2, IsolationLevel.DOCKER)
    assert v.stdout == "hi\nhi\n"
    assert list(tmp_path.iterdir()) == []  # the job's work dir was removed


def test_garbage_from_the_container_is_an_error():
    v = DockerBackend().verdict_from_output(JOB, "ab" * 16, 125, b"", b"Unable to find image")
    assert v.status is Status.ERROR and "Unable to find image" in v.detail


@pytest.fixture(scope="module")
def docker_backend(docker_engine):
    from tests.docker_engine import base_image

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", docker_engine.host)  # the docker CLI the backend runs talks to this engine
        backend = DockerBackend(
            image=base_image(docker_engine), python="/usr/bin/python3", volumes=["/usr:/usr:ro"], startup_grace_s=60
        )
        assert backend.available(), "`docker info` fails against the test engine"
        yield backend


@pytest.mark.docker
def test_docker_runs_jobs_isolated(docker_backend):
    ok = Job("def add(a, b):\n    return a + b\n", [TestCase("add(1, 2)", 3)])
    net = Job(
        "import socket\ndef add(a, b):\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    return a + b\n",
        [TestCase("add(1, 2)", 3)],
    )
    bomb = Job("x = bytearray(10 ** 10)\n", [TestCase("1", 1)])
    verdicts = docker_backend.run_batch([ok, net, bomb], concurrency=3)
    assert [v.status for v in verdicts] == [Status.PASSED, Status.FAILED, Status.MEMORY]
    assert all(v.isolation is IsolationLevel.DOCKER for v in verdicts)
