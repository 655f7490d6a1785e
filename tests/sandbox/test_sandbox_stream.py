"""The host's reading of a job's result stream and report: only a clean, complete, correctly framed stream
of right values is a pass; nothing in stdout, stderr or the exit code can make one."""

from __future__ import annotations

import base64
import signal

import pytest

from sandbox import IsolationLevel, Job, Limits, Status, TestCase
from sandbox.verdict import make_verdict, parse_results

NONCE = "ab" * 16
JOB = Job("irrelevant", [TestCase("f(1)", 1), TestCase("f(2)", 4)], Limits(cpu_s=2))


def stream(*frames: str, nonce: str = NONCE) -> bytes:
    return b"".join(f"{nonce} {f}\n".encode() for f in frames)


def report(results: bytes, **kw) -> dict:
    base = {
        "exit_code": 0,
        "signal": None,
        "timed_out": False,
        "output_limit": False,
        "result_overflow": False,
        "wall_s": 0.01,
        "cpu_s": 0.01,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "results": base64.b64encode(results).decode(),
    }
    base.update(kw)
    return base


def verdict(results: bytes, **kw):
    return make_verdict(JOB, report(results, **kw), NONCE, IsolationLevel.NAMESPACES_UID)


GOOD = stream('{"start":2}', '{"i":0,"v":1}', '{"i":1,"v":4}', '{"done":2}')


def test_clean_stream_passes():
    v = verdict(GOOD)
    assert (v.status, v.passed, v.total) == (Status.PASSED, 2, 2)


def test_wrong_value_fails_with_detail():
    v = verdict(stream('{"start":2}', '{"i":0,"v":1}', '{"i":1,"v":5}', '{"done":2}'))
    assert (v.status, v.passed) == (Status.FAILED, 1)
    assert "expected 4, got 5" in v.detail


@pytest.mark.parametrize(
    "name, results, kw",
    [
        ("no stream at all", b"", {}),
        ("missing done frame", stream('{"start":2}', '{"i":0,"v":1}', '{"i":1,"v":4}'), {}),
        ("last line cut off", GOOD[:-1], {}),
        ("duplicate index", stream('{"start":2}', '{"i":0,"v":1}', '{"i":0,"v":1}', '{"i":1,"v":4}', '{"done":2}'), {}),
        (
            "index out of range",
            stream('{"start":2}', '{"i":0,"v":1}', '{"i":1,"v":4}', '{"i":2,"v":4}', '{"done":2}'),
            {},
        ),
        ("frame after done", GOOD + stream('{"i":1,"v":4}'), {}),
        ("done before all values", stream('{"start":2}', '{"i":0,"v":1}', '{"done":2}', '{"i":1,"v":4}'), {}),
        ("frames before start", stream('{"i":0,"v":1}', '{"start":2}', '{"i":1,"v":4}', '{"done":2}'), {}),
        ("wrong start count", stream('{"start":1}', '{"i":0,"v":1}', '{"i":1,"v":4}', '{"done":2}'), {}),
        ("garbled json", stream('{"start":2}', '{"i":0,"v":1', '{"i":1,"v":4}', '{"done":2}'), {}),
        ("NaN constant", stream('{"start":2}', '{"i":0,"v":NaN}', '{"i":1,"v":4}', '{"done":2}'), {}),
        ("unknown tag", stream('{"start":2}', '{"i":0,"v":{"$evil":1}}', '{"i":1,"v":4}', '{"done":2}'), {}),
        (
            "right values, other nonce",
            stream('{"start":2}', '{"i":0,"v":1}', '{"i":1,"v":4}', '{"done":2}', nonce="cd" * 16),
            {},
        ),
        ("non-zero exit", GOOD, {"exit_code": 3}),
        ("killed after reporting", GOOD, {"signal": signal.SIGKILL, "exit_code": None}),
        ("wall timeout after reporting", GOOD, {"timed_out": True}),
        ("output bomb after reporting", GOOD, {"output_limit": True}),
        ("result overflow", GOOD, {"result_overflow": True}),
        ("supervisor error", GOOD, {"error": "boom"}),
    ],
)
def test_anything_but_a_clean_complete_stream_is_no_pass(name, results, kw):
    v = verdict(results, **kw)
    assert v.status is not Status.PASSED, name
    assert not v.ok


def test_stdout_claims_and_exit_code_never_grant_a_pass():
    v = verdict(stream('{"start":2}'), stdout="PASSED 2/2\nOK\n" + NONCE + ' {"i":0,"v":1}\n', exit_code=0)
    assert v.status is Status.FAILED
    assert v.passed == 0


def test_unframed_lines_are_ignored_and_counted():
    noisy = b"junk\n" + GOOD[:30] + b"\n" + GOOD + b"more junk\n"
    stream_ = parse_results(noisy, NONCE, 2)
    assert stream_.done and not stream_.corrupted
    assert stream_.stray_lines == 3
    assert verdict(noisy).status is Status.PASSED


@pytest.mark.parametrize(
    "kw, status",
    [
        ({"timed_out": True, "signal": signal.SIGKILL}, Status.TIMEOUT),
        ({"signal": signal.SIGXCPU}, Status.TIMEOUT),
        ({"signal": signal.SIGKILL, "cpu_s": 1.95}, Status.TIMEOUT),  # hard RLIMIT_CPU
        ({"signal": signal.SIGKILL, "cpu_s": 0.1}, Status.CRASHED),
        ({"signal": signal.SIGSEGV}, Status.CRASHED),
        ({"signal": signal.SIGABRT, "stderr": "Fatal Python error: ... MemoryError"}, Status.MEMORY),
        ({"output_limit": True, "signal": signal.SIGKILL}, Status.OUTPUT_LIMIT),
    ],
)
def test_status_from_how_the_job_ended(kw, status):
    assert verdict(stream('{"start":2}'), **kw).status is status


def test_memory_error_frames_mean_memory():
    v = verdict(stream('{"start":2}', '{"program_error":"MemoryError","memory":true}'))
    assert v.status is Status.MEMORY


def test_no_start_frame_is_a_sandbox_error():
    v = verdict(b"", exit_code=127, stderr="sandbox: job setup failed")
    assert v.status is Status.ERROR
    assert "did not start" in v.detail
