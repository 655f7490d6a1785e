"""Code rewards through the real sandbox HTTP service (`python -m sandbox serve`, a subprocess): the same
rewards as the local pool on a small batch with a hostile program, and the token the service demands."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandbox import Job, SandboxUnavailable, TestCase
from sandbox.client import RemoteSandbox
from training.rewards import code as code_mod, score_tasks
from training.tasksets.schema import Task

REPO = Path(__file__).resolve().parents[3]
TESTS = [{"call": "add(2, 3)", "expected": 5}, {"call": "add(-1, 1)", "expected": 0}]
TASK = Task("add", "code", "write add", "code", tests=TESTS)
COMPLETIONS = [
    "def add(a, b):\n    return a + b\n",  # passes
    "def add(a, b):\n    return a - b\n",  # wrong value
    "```python\ndef add(a, b):\n    return a + b\n```",  # fenced, passes
    "def add(a, b):\n    while True:\n        pass\n",  # timeout
    # hostile: tries to forge its verdict, fork-bomb, read the host and phone home; must score 0
    "import os, socket\nprint('PASSED')\ntry:\n    socket.create_connection(('1.1.1.1', 53), 1)\nexcept OSError:\n"
    "    pass\nfor _ in range(50):\n    try:\n        os.fork()\n    except OSError:\n        break\n"
    "def add(a, b):\n    os._exit(0)\n",
    "def add(a, b) return",  # not Python
]
EXPECTED = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(env_token: str | None, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "POSTTRAIN_SANDBOX_TOKEN"}
    if env_token is not None:
        env["POSTTRAIN_SANDBOX_TOKEN"] = env_token
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--concurrency",
            "2",
            *extra,
        ],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            if "cannot" in err or "isolat" in err:
                pytest.skip(f"the sandbox cannot isolate jobs on this machine: {err.strip()}")
            raise AssertionError(f"sandbox server exited {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if json.loads(resp.read())["ok"]:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("sandbox server did not come up in 60 s")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def service():
    token = secrets.token_hex(16)
    proc, url = _serve(token)
    try:
        _wait_up(proc, url)
        yield url, token
    finally:
        _stop(proc)


@pytest.fixture
def remote(service, monkeypatch):
    url, token = service
    monkeypatch.setenv("POSTTRAIN_SANDBOX_TOKEN", token)
    code_mod.use_remote_sandbox(url)
    yield url
    code_mod.use_remote_sandbox(None)


def test_remote_rewards_equal_local(remote) -> None:
    tasks = [TASK] * len(COMPLETIONS)
    remote_scores = list(score_tasks(tasks, COMPLETIONS))
    remote_verdicts = code_mod._verdicts(tasks, COMPLETIONS)
    code_mod.use_remote_sandbox(None)
    local_scores = list(score_tasks(tasks, COMPLETIONS))
    local_verdicts = code_mod._verdicts(tasks, COMPLETIONS)
    assert remote_scores == local_scores == EXPECTED
    assert [(v.status, v.passed, v.total) if v else None for v in remote_verdicts] == [
        (v.status, v.passed, v.total) if v else None for v in local_verdicts
    ]
    assert remote_verdicts[3].status.value == "timeout"


def test_config_field_sends_jobs_to_the_service(service, monkeypatch) -> None:
    # The stage config's sandbox_url, with the token only in the environment: a run with the wrong token fails
    # loudly rather than scoring every program 0.
    url, token = service
    monkeypatch.setenv("POSTTRAIN_SANDBOX_TOKEN", "not-" + token)
    code_mod.use_remote_sandbox(url)
    try:
        with pytest.raises(SandboxUnavailable, match="HTTP 403"):
            score_tasks([TASK], COMPLETIONS[:1])
    finally:
        code_mod.use_remote_sandbox(None)


@pytest.mark.parametrize("token, code", [(None, 401), ("wrong", 403), ("", 401)])
def test_requests_without_the_token_are_refused(service, token, code) -> None:
    url, _ = service
    body = json.dumps(Job("def add(a, b):\n    return a + b\n", [TestCase("add(1, 2)", 3)]).to_dict()).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + "/run", data=body, headers=headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == code


def test_client_with_the_right_token(service) -> None:
    url, token = service
    [verdict] = RemoteSandbox(url, token).run_batch([Job("def f():\n    return 1\n", [TestCase("f()", 1)])])
    assert verdict.ok


def test_server_refuses_to_start_without_a_token() -> None:
    proc, _ = _serve(None)
    try:
        assert proc.wait(60) == 2
        assert "POSTTRAIN_SANDBOX_TOKEN is not set" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            _stop(proc)
    # --insecure-loopback is for 127.0.0.1 only: on a routable address it still refuses
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "POSTTRAIN_SANDBOX_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "sandbox", "serve", "--host", "0.0.0.0", "--port", str(port), "--insecure-loopback"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "POSTTRAIN_SANDBOX_TOKEN is not set" in out.stderr
