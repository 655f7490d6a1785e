"""The HTTP front: GET /health, POST /run with one job or a list, errors as JSON with 4xx codes."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from sandbox import Job, Pool, TestCase
from sandbox.server import make_server

JOB = Job("def add(a, b):\n    return a + b\n", [TestCase("add(1, 2)", 3), TestCase("add((1,), (2,))", (1, 2))])


@pytest.fixture(scope="module")
def url(pool: Pool):
    server = make_server("127.0.0.1", 0, pool, concurrency=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def call(url: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    req = urllib.request.Request(
        url + path,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_health(url):
    code, body = call(url, "/health")
    assert code == 200 and body["ok"] is True and body["isolation"]


def test_run_one_job(url):
    code, body = call(url, "/run", json.dumps(JOB.to_dict()).encode())
    assert code == 200
    assert body["status"] == "passed" and body["passed"] == 2 and body["id"] == JOB.id


def test_run_a_list_keeps_order(url):
    wrong = Job("def add(a, b):\n    return 0\n", JOB.tests, id="wrong")
    code, body = call(url, "/run", json.dumps([JOB.to_dict(), wrong.to_dict(), JOB.to_dict()]).encode())
    assert code == 200
    assert [v["status"] for v in body] == ["passed", "failed", "passed"]
    assert body[1]["id"] == "wrong"


@pytest.mark.parametrize(
    "path, body, code, fragment",
    [
        ("/run", b"{nope", 400, "not JSON"),
        ("/run", b"[]", 400, "list of 1.."),
        ("/run", b'{"program": "x"}', 400, "'tests' must be a list"),
        ("/run", b'{"program": "x", "tests": [{"call": "f("}]}', 400, "missing field 'expected'"),
        ("/run", b'{"program": "x", "tests": [], "limits": {"wall_s": -1}}', 400, "wall_s"),
        ("/nope", b"{}", 404, "no such endpoint"),
    ],
)
def test_errors(url, path, body, code, fragment):
    got, payload = call(url, path, body)
    assert got == code
    assert fragment in payload["error"]
