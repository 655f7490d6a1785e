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


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or broken stream only loses output
            pass


def _finish(code: int = 0) -> NoReturn:
    _flush()
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


# ---------------------------------------------------------------------------------------------------------------
# Test programs: the test runs in this process, the candidate in a child, and only plain values pass between.
#
# Why two processes: a whole test program (loops, helpers, `check(candidate)`) cannot move to the host the way a
# call/expected pair does, so its verdict is computed inside the job. It can only be trusted if candidate code
# never runs where the verdict is computed. So this process (trusted: our harness, the task's setup and test
# program) forks the candidate process, becomes non-dumpable (a same-uid process can no longer read or write its
# memory or reach its fds through /proc or ptrace), and keeps the result pipe to itself. The candidate's functions
# are reached through stubs that encode the arguments, send them down a pipe, and decode the reply strictly into
# exact built-in types: no candidate object, `__eq__`, frame or patched module ever exists in this process.

_EXCEPTIONS = {
    name: obj for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, Exception)
}


class CandidateError(Exception):
    """The candidate's function raised an exception that is not a built-in one (or could not be reported)."""


def _send(fd: int, obj: Any) -> None:
    view = memoryview(json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode() + b"\n")
    while view:
        view = view[os.write(fd, view) :]


def _serve_candidate(program: str, requests: Any, reply_fd: int) -> NoReturn:
    """The candidate process: run the program, then answer calls until the test process hangs up."""
    namespace: dict[str, Any] = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(program, "<solution>", "exec"), namespace)
    except BaseException as exc:
        _flush()
        _send(reply_fd, {"program_error": describe(exc), "memory": _type(exc) is MemoryError})
        _finish(0)
    _send(reply_fd, {"ready": True})
    from sandbox.values import decode

    while True:
        line = requests.readline()
        if not line:
            _finish(0)
        try:
            msg = json.loads(line)
            fn = namespace.get(msg["f"])
            if fn is None:
                raise NameError(f"name {msg['f']!r} is not defined")
            value = fn(*decode(msg["a"]), **decode(msg["k"]))
            reply: dict[str, Any] = {"v": encode(value)}
        except BaseException as exc:
            try:
                reply = {"e": _type(exc).__name__, "m": describe(exc), "memory": _type(exc) is MemoryError}
            except BaseException:  # noqa: BLE001 - an exception whose type name cannot be read
                reply = {"e": "Exception", "m": "exception (undescribable)", "memory": False}
        _flush()  # before the reply: the test process may finish (and, as pid 1, take us down) once it has it
        try:
            _send(reply_fd, reply)
        except BaseException:  # noqa: BLE001 - an unsendable reply (e.g. memory): the test sees a hang-up
            _finish(1)


class _Channel:
    """The test process's end of the pipe pair; `call` is what every candidate stub does."""

    def __init__(self, request_fd: int, replies: Any, max_bytes: int) -> None:
        self.request_fd, self.replies, self.max_bytes = request_fd, replies, max_bytes
        self.memory = False

    def receive(self) -> dict[str, Any]:
        line = self.replies.readline(self.max_bytes)
        if not line.endswith(b"\n"):
            raise CandidateError("the candidate process exited or sent an oversized reply")
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise CandidateError("malformed reply from the candidate process")
        return msg

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        from sandbox.values import ProtocolError, decode

        try:
            request = {"f": name, "a": encode(list(args)), "k": encode(dict(kwargs))}
        except Unserialisable as exc:
            raise TypeError(f"cannot pass this argument to the candidate's {name}: {exc}") from None
        _send(self.request_fd, request)
        msg = self.receive()
        if "v" in msg and len(msg) == 1:
            try:
                return decode(msg["v"])
            except (ProtocolError, TypeError, RecursionError) as exc:
                raise CandidateError(f"{name} returned an undecodable value: {exc}") from None
        if "e" in msg:
            self.memory = self.memory or msg.get("memory") is True
            kind = _EXCEPTIONS.get(str(msg["e"]), CandidateError)
            raise kind(f"(raised by the candidate's {name}) {str(msg.get('m', ''))[:300]}")
        raise CandidateError("malformed reply from the candidate process")


def _stub(channel: _Channel, name: str) -> Any:
    def candidate(*args: Any, **kwargs: Any) -> Any:
        return channel.call(name, args, kwargs)

    candidate.__name__ = candidate.__qualname__ = name
    return candidate


def candidate_names(source: str, setup: str, entry_point: str | None) -> list[str]:
    """The names a test program takes from the candidate: those it reads but neither it nor the setup binds
    (builtins excluded, so a candidate can never stand in for `len` or `isinstance`), plus the entry point."""
    import ast

    read: set[str] = set()
    bound = set(vars(builtins))
    for tree in (ast.parse(setup), ast.parse(source)):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    names = sorted(read - bound)
    if entry_point is not None and entry_point not in names:
        names.append(entry_point)
    return names


def _where(exc: BaseException, source: str) -> str:
    """` at test line N: <line>` where the test program failed (trusted code: safe to walk the traceback)."""
    tb, lineno = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    if lineno is None:
        return ""
    lines = source.splitlines()
    text = lines[lineno - 1].strip()[:200] if 0 < lineno <= len(lines) else ""
    return f" at test line {lineno}" + (f": {text}" if text else "")


def run_test_program(
    program: str, test_fd: int, read_test: Any, nonce: str, result_fd: int, max_result_bytes: int
) -> NoReturn:
    """Run the test program still unread in `test_fd` (`read_test(fd)` -> TestProgram.to_dict()) against
    `program`; report one value: True when every assertion held.

    The candidate process is forked before the test program is read, and closes `test_fd` and the result
    pipe first thing: its memory never holds the tests (so no frame or object walk can find the expected
    values), and it has no way to write a result."""
    from sandbox import isolation

    out = _Writer(result_fd, nonce, max_result_bytes, 1)
    out.raw(b'{"start":1}')
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # before the fork: the candidate can never attach to us
    to_candidate_r, to_candidate_w = os.pipe()
    from_candidate_r, from_candidate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate process
        for fd in (test_fd, result_fd, to_candidate_w, from_candidate_r):
            os.close(fd)
        _serve_candidate(program, os.fdopen(to_candidate_r, "rb"), from_candidate_w)
    os.close(to_candidate_r)
    os.close(from_candidate_w)
    test = read_test(test_fd)
    source, setup, entry = test["source"], test.get("setup") or "", test.get("entry_point")
    channel = _Channel(to_candidate_w, os.fdopen(from_candidate_r, "rb"), max_result_bytes)
    try:
        first = channel.receive()
    except (CandidateError, ValueError) as exc:
        first = {"program_error": describe(exc)}
    if "program_error" in first or first != {"ready": True}:
        out.frame(
            {
                "program_error": str(first.get("program_error", "malformed start from the candidate")),
                "memory": first.get("memory") is True,
            }
        )
        _finish(0)
    namespace: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
    try:
        exec(compile(setup, "<setup>", "exec"), namespace)
        for name in candidate_names(source, setup, entry):
            namespace[name] = _stub(channel, name)
        exec(compile(source, "<test>", "exec"), namespace)
        if entry is not None:
            namespace["check"](namespace[entry])
        frame: dict[str, Any] = {"i": 0, "v": True}
    except BaseException as exc:
        frame = {
            "i": 0,
            "error": describe(exc) + _where(exc, source),
            "memory": channel.memory or _type(exc) is MemoryError,
        }
    out.frame(frame)
    out.raw(b'{"done":1}')
    _finish(0)
