"""Runs inside the job process, after confinement: execute the program, evaluate each test call, and write
the *values* to the result pipe. Expected values never reach this process, so nothing written here can claim
a pass: the host compares. Everything in this process is under the candidate's control once its code runs;
that is fine, because the only thing it can do with that control is report values, and reporting the right
values requires computing them.

Frames are lines `<nonce> <json>\\n` on the result fd; the per-job nonce keeps stray writes (a forked child,
a program that scribbles on every fd) from being mistaken for results.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

MAX_DEPTH = 100
_type = type  # captured before candidate code could shadow anything


class Unserialisable(Exception):
    """The value is not one of the plain types the protocol carries."""


def encode(value: Any, budget: list[int] | None = None, depth: int = 0) -> Any:
    """Plain Python value -> tagged JSON-able structure (see sandbox.values). Exact types only: an int
    subclass with a lying __eq__ is refused, not converted."""
    if budget is None:
        budget = [1_000_000]
    budget[0] -= 1
    if budget[0] < 0:
        raise Unserialisable("value too large")
    if depth > MAX_DEPTH:
        raise Unserialisable("value nested too deeply")
    t = _type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        if value.bit_length() > 64_000:
            raise Unserialisable("integer too large")
        return value
    if t is float:
        if math.isfinite(value):
            return value
        return {"$f": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    if t is list:
        return [encode(v, budget, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [encode(v, budget, depth + 1) for v in value]}
    if t is dict:
        return {"$d": [[encode(k, budget, depth + 1), encode(v, budget, depth + 1)] for k, v in value.items()]}
    if t is set:
        return {"$s": [encode(v, budget, depth + 1) for v in value]}
    if t is frozenset:
        return {"$fs": [encode(v, budget, depth + 1) for v in value]}
    if t is bytes:
        import base64  # rare: not preloaded into every job

        return {"$b": base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"$c": [encode(value.real, budget, depth + 1), encode(value.imag, budget, depth + 1)]}
    if getattr(t, "__module__", "") == "numpy" and hasattr(value, "tolist"):
        # numpy scalars/arrays are common in legitimate answers; tolist() yields plain types (checked again)
        return encode(value.tolist(), budget, depth + 1)
    raise Unserialisable(f"cannot report a value of type {getattr(t, '__name__', '?')}")


def describe(exc: BaseException, limit: int = 300) -> str:
    try:
        name = _type(exc).__name__
        text = str(exc)
    except BaseException:  # a candidate exception whose __str__ itself raises
        return "exception (undescribable)"
    text = f"{name}: {text}" if text else name
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Writer:
    def __init__(self, fd: int, nonce: str, max_bytes: int, n_calls: int) -> None:
        self.fd = fd
        self.prefix = nonce.encode("ascii") + b" "
        self.left = max_bytes
        self.reserve = 200 * (n_calls + 3)  # room for small error/done frames after a big value

    def frame(self, obj: dict[str, Any], big: bool = False) -> bool:
        payload = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
        if big and len(payload) + len(self.prefix) + 1 > self.left - self.reserve:
            return False
        return self.raw(payload)

    def raw(self, payload: bytes) -> bool:
        line = self.prefix + payload + b"\n"
        view = memoryview(line)
        while view:
            try:
                n = os.write(self.fd, view)
            except InterruptedError:
                continue
            except OSError:
                _finish(1)
            view = view[n:]
        self.left -= len(line)
        return True


def _finish(code: int = 0) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    # os._exit: no atexit hooks, no waiting for non-daemon threads the program left behind
    os._exit(code)


_WARM_PROGRAM = """
import math, collections
from typing import List

class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

def solve(xs: List[int], k: int = 2) -> list:
    out = [x * k for x in xs if x % 2 == 0]
    seen = {x: str(x) for x in xs}
    try:
        total = sum(xs) / len(xs)
    except ZeroDivisionError as exc:
        total = float(len(str(exc)))
    return [out, sorted(seen), (total, f"{total:.2f}"), math.sqrt(4), collections.Counter(xs).most_common(1)]
"""


def warm_up(devnull_fd: int) -> None:
    """Run the harness's own code paths once in the worker. Python builds a lot of state lazily on first
    use (the compiler's tables above all); built here, it is inherited by every job instead of being built,
    page-fault by page-fault, in each of them."""
    out = _Writer(devnull_fd, "0" * 32, 1 << 20, 2)
    out.raw(b'{"start":2}')
    namespace: dict[str, Any] = {"__name__": "__warm__", "__builtins__": builtins}
    exec(compile(_WARM_PROGRAM, "<solution>", "exec"), namespace)
    for i, call in enumerate(("solve([1, 2, 3, 4])", "solve([])", "Point(1, 2)")):
        try:
            frame: dict[str, Any] = {"i": i, "v": encode(eval(compile(call, f"<test {i}>", "eval"), namespace))}
        except BaseException as exc:  # noqa: BLE001 - the same path a job's failing call takes
            frame = {"i": i, "error": describe(exc), "memory": False}
        out.frame(frame, big=True)
    out.raw(b'{"done":2}')


def run(program: str, calls: Sequence[str], nonce: str, result_fd: int, max_result_bytes: int) -> NoReturn:
    pid = os.getpid()
    out = _Writer(result_fd, nonce, max_result_bytes, len(calls))
    out.raw(b'{"start":%d}' % len(calls))  # everything after this frame is the candidate's doing

    def forked() -> bool:
        # a process the program forked returns through here too; it must not report results
        return os.getpid() != pid

    namespace: dict[str, Any] = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(program, "<solution>", "exec"), namespace)
    except BaseException as exc:
        if forked():
            os._exit(0)
        out.frame({"program_error": describe(exc), "memory": _type(exc) is MemoryError})
        _finish(0)
    if forked():
        os._exit(0)
    for i, call in enumerate(calls):
        try:
            value = eval(compile(call, f"<test {i}>", "eval"), namespace)
            frame: dict[str, Any] = {"i": i, "v": encode(value)}
        except BaseException as exc:
            frame = {"i": i, "error": describe(exc), "memory": _type(exc) is MemoryError}
        if forked():
            os._exit(0)
        try:
            written = out.frame(frame, big=True)
        except BaseException as exc:  # e.g. MemoryError while serialising a huge value
            written, frame = False, {"i": i, "error": describe(exc)}
        if not written:
            out.frame({"i": i, "error": frame.get("error", "result too large")})
    out.raw(b'{"done":%d}' % len(calls))
    _finish(0)
