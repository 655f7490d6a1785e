"""Symbolic answer equivalence through Hugging Face `math-verify`, in a worker process, every check time-bounded.

    checker = SymbolicChecker(timeout_s=3.0)
    checker.equal_many([("\\frac{\\sqrt{3}}{2}", "\\sqrt3/2"), ("[0, 1)", "[0,1)")])   # [True, True]

Why a worker process: math-verify bounds parsing and comparison with `signal.alarm`, which works only in the
main thread of the main interpreter; rewards are computed from trainer threads, HTTP handlers and pools. And
an alarm cannot interrupt a long C-level computation (a sympy simplification of a huge power), so the alarm
alone cannot promise that a batch never hangs. Here math-verify runs in the worker's main thread with its own
timeouts, and the host gives every pair a hard deadline on top: a worker that does not answer in time is
killed (the pair scores False and is counted in `timeouts`) and a fresh one takes the remaining pairs.

Answers are compared as math-verify's own users do: `verify(parse(gold), parse(pred))`, both wrapped in `$...$`
so a bare answer ("\\pi/4", "(1, 2)") parses as LaTeX. Results are cached per (gold, pred).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

_WORKER = """
import json, sys, logging
logging.disable(logging.CRITICAL)  # math-verify logs every timeout and parse failure as a warning
from math_verify import parse, verify
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]
sys.stdout.write('{"ready": true}\\n'); sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    t = max(1, int(req["t"]))
    try:
        gold = parse(req["gold"], extraction_config=CONFIG, parsing_timeout=t)
        pred = parse(req["pred"], extraction_config=CONFIG, parsing_timeout=t)
        ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=t)
    except BaseException:
        ok = False
    sys.stdout.write(json.dumps({"ok": bool(ok)}) + "\\n"); sys.stdout.flush()
"""


def latex_wrapped(answer: str) -> str:
    """`$answer$` unless it already carries its own math delimiters or a \\boxed{}."""
    text = answer.strip()
    if text.startswith("$") or "\\boxed" in text or text.startswith("\\(") or text.startswith("\\["):
        return text
    return f"${text}$"


class SymbolicUnavailable(RuntimeError):
    """math-verify cannot be started (not installed, or the worker died at startup)."""


class SymbolicChecker:
    """Thread-safe; one worker process, started on first use and restarted after a timeout."""

    def __init__(self, timeout_s: float = 3.0, cache_size: int = 65536, start_timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.cache_size = cache_size
        self.timeouts = 0
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # the hard deadline per pair: parsing both answers and the comparison each get math-verify's own timeout
    @property
    def deadline_s(self) -> float:
        return 3 * max(1.0, self.timeout_s) + 2.0

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise SymbolicUnavailable(f"cannot start the math-verify worker: {exc}") from exc
        if self._readline(proc, self.start_timeout_s) != {"ready": True}:
            self._kill(proc)
            raise SymbolicUnavailable("the math-verify worker did not start (is math-verify installed?)")
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout_s: float) -> dict | None:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = proc.stdout.readline()
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._kill(self._proc)
                self._proc = None

    def _ask(self, gold: str, pred: str) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps({"gold": gold, "pred": pred, "t": self.timeout_s}) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            self._proc = None
            return False
        started = time.monotonic()
        reply = self._readline(proc, self.deadline_s)
        if reply is None:  # hung past every math-verify timeout (or died): kill it, the next pair gets a new one
            self.timeouts += int(time.monotonic() - started >= self.deadline_s)
            self._kill(proc)
            self._proc = None
            return False
        return reply.get("ok") is True

    def equal_many(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        """For each (gold, predicted) answer: are they the same mathematical object (per math-verify)?"""
        out = []
        with self._lock:
            for gold, pred in pairs:
                key = (gold, pred)
                if key in self.cache:
                    self.cache.move_to_end(key)
                    out.append(self.cache[key])
                    continue
                ok = self._ask(latex_wrapped(gold), latex_wrapped(pred))
                self.cache[key] = ok
                if len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
                out.append(ok)
        return out


_DEFAULT: SymbolicChecker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_checker() -> SymbolicChecker:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SymbolicChecker()
        return _DEFAULT
