"""Report + job -> Verdict, on the host. The only place a pass is decided.

A pass needs: a result stream framed with this job's nonce, well-formed, one value per test, each equal to
the expected value (compared here, with values the job never saw), a clean exit, and no limit hit. Exit
codes and output can only take a pass away, never grant one.
"""

from __future__ import annotations

import base64
import binascii
import json
import signal as signals
from dataclasses import dataclass, field
from typing import Any

from sandbox.spec import CaseResult, IsolationLevel, Job, Status, Verdict
from sandbox.values import ProtocolError, decode, short_repr, values_equal

_MEMORY_HINTS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc")


@dataclass
class ResultStream:
    started: bool = False
    done: bool = False
    program_error: str | None = None
    memory: bool = False
    values: dict[int, tuple[bool, Any]] = field(default_factory=dict)  # i -> (ok, value | error text)
    corrupted: str | None = None
    stray_lines: int = 0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse_results(raw: bytes, nonce: str, total: int) -> ResultStream:
    """Strictly parse the result stream. Lines without this job's nonce are ignored (counted); a framed
    line that is malformed, duplicated or out of order marks the whole stream corrupted (no pass)."""
    out = ResultStream()
    prefix = nonce.encode("ascii") + b" "
    lines = raw.split(b"\n")
    for line in lines[:-1]:  # the last piece has no newline: cut off mid-write, never trusted
        if not line.startswith(prefix):
            out.stray_lines += 1
            continue
        try:
            frame = json.loads(line[len(prefix) :], parse_constant=_reject_constant)
            _apply(out, frame, total)
        except (ValueError, TypeError) as exc:
            out.corrupted = out.corrupted or f"corrupted result stream: {str(exc)[:200]}"
    return out


def _apply(out: ResultStream, frame: Any, total: int) -> None:
    if not isinstance(frame, dict):
        raise ProtocolError("frame is not an object")
    if out.done:
        raise ProtocolError("frame after the end of the stream")
    if "start" in frame:
        if out.started or frame["start"] != total:
            raise ProtocolError("bad start frame")
        out.started = True
        return
    if not out.started:
        raise ProtocolError("frame before the start frame")
    if "program_error" in frame:
        if out.program_error is not None or out.values:
            raise ProtocolError("unexpected program_error frame")
        out.program_error = str(frame["program_error"])[:500]
        out.memory = out.memory or frame.get("memory") is True
        return
    if "done" in frame:
        if frame["done"] != total or len(out.values) != total or out.program_error is not None:
            raise ProtocolError("bad done frame")
        out.done = True
        return
    i = frame.get("i")
    if type(i) is not int or not 0 <= i < total or i in out.values or out.program_error is not None:
        raise ProtocolError(f"bad or repeated test index {i!r}")
    if "v" in frame and len(frame) == 2:
        out.values[i] = (True, decode(frame["v"]))
    elif "error" in frame and set(frame) <= {"i", "error", "memory"}:
        out.values[i] = (False, str(frame["error"])[:500])
        out.memory = out.memory or frame.get("memory") is True
    else:
        raise ProtocolError("bad value frame")


def _signal_name(sig: int) -> str:
    try:
        return signals.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def error_verdict(job: Job, level: IsolationLevel, detail: str) -> Verdict:
    return Verdict(
        id=job.id,
        status=Status.ERROR,
        passed=0,
        total=len(job.checks),
        duration_s=0.0,
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
        isolation=level,
        detail=detail,
    )


def make_verdict(job: Job, report: dict[str, Any], nonce: str, level: IsolationLevel) -> Verdict:
    if not isinstance(report, dict):
        return error_verdict(job, level, "malformed supervisor report")
    if report.get("error"):
        return error_verdict(job, level, str(report["error"]))
    try:
        raw = base64.b64decode(report.get("results", ""), validate=True)
    except (binascii.Error, ValueError):
        return error_verdict(job, level, "malformed supervisor report")
    limits = job.effective_limits
    checks = job.checks
    total = len(checks)
    stream = parse_results(raw, nonce, total)

    cases: list[CaseResult] = []
    for i, test in enumerate(checks):
        if stream.program_error is not None:
            cases.append(CaseResult(i, False, "program failed before tests ran"))
            continue
        got = stream.values.get(i)
        if got is None:
            cases.append(CaseResult(i, False, "no result"))
        elif not got[0]:
            cases.append(CaseResult(i, False, got[1]))
        elif values_equal(test.expected, got[1], test.rel_tol, test.abs_tol):
            cases.append(CaseResult(i, True, ""))
        else:
            cases.append(
                CaseResult(i, False, f"{test.call}: expected {short_repr(test.expected)}, got {short_repr(got[1])}")
            )
    if stream.corrupted:  # a tampered stream earns nothing, whatever parsed before the damage
        cases = [CaseResult(c.index, False, c.detail or stream.corrupted) for c in cases]
    passed = sum(c.passed for c in cases)

    exit_code, sig = report.get("exit_code"), report.get("signal")
    cpu_s = report.get("cpu_s") or 0.0
    stderr = report.get("stderr", "")
    cpu_limit = int(limits.cpu_s + 0.999)
    if report.get("timed_out"):
        status, detail = Status.TIMEOUT, f"wall time limit exceeded ({limits.wall_s:g}s)"
    elif report.get("output_limit"):
        status, detail = Status.OUTPUT_LIMIT, f"output exceeded {limits.output_kill_bytes} bytes"
    elif report.get("result_overflow"):
        status, detail = Status.FAILED, f"result stream exceeded {limits.max_result_bytes} bytes (killed)"
    elif sig == signals.SIGXCPU or (sig == signals.SIGKILL and cpu_s >= 0.9 * cpu_limit):
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (rusage rounds a little low)
        status, detail = Status.TIMEOUT, f"CPU time limit exceeded ({limits.cpu_s:g}s)"
    elif not stream.started and sig is None:
        status, detail = Status.ERROR, f"the sandbox harness did not start: {stderr[-500:].strip()}"
    elif total == passed and stream.done and not stream.corrupted and exit_code == 0 and sig is None:
        status, detail = Status.PASSED, f"{passed}/{total} tests passed"
    elif stream.memory or (sig is not None and any(h in stderr for h in _MEMORY_HINTS)):
        status, detail = Status.MEMORY, f"memory limit exceeded ({limits.memory_mb} MB)"
    elif sig is not None:
        status, detail = Status.CRASHED, f"killed by {_signal_name(sig)}"
    else:
        status = Status.FAILED
        if stream.corrupted:
            detail = stream.corrupted
        elif stream.program_error is not None:
            detail = f"program raised {stream.program_error}"
        elif not stream.done:
            detail = f"exited (code {exit_code}) before reporting every result"
        else:
            first = next((c for c in cases if not c.passed), None)
            detail = f"{passed}/{total} tests passed" + (f"; first failure: {first.detail}" if first else "")
    if stream.stray_lines:
        detail += f" ({stream.stray_lines} unframed line(s) on the result channel ignored)"
    return Verdict(
        id=job.id,
        status=status,
        passed=passed,
        total=total,
        duration_s=float(report.get("wall_s") or 0.0),
        stdout=report.get("stdout", ""),
        stderr=stderr,
        stdout_truncated=bool(report.get("stdout_truncated")),
        stderr_truncated=bool(report.get("stderr_truncated")),
        isolation=level,
        detail=detail,
        exit_code=exit_code,
        signal=sig,
        cases=tuple(cases),
    )
