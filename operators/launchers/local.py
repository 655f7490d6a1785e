"""Run a stage as a local process: laptops, CI, and a worker that is itself the GPU machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from operators.launchers.base import StageTimeout
from operators.spec import StageSpec


class LocalProcessLauncher:
    """The stage runs in its own session, so `stop` reaches the whole process group (dataloader workers,
    sandbox pools), not only the `posttrain` process."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def resolve(argv: list[str]) -> list[str]:
        # Prefer the `posttrain` (and `torchrun`) next to the worker's interpreter: the same venv Airflow runs in.
        if argv and argv[0] == "posttrain" and not shutil.which("posttrain"):
            return [sys.executable, "-m", "training.cli", *argv[1:]]
        if argv and argv[0] == "torchrun" and not shutil.which("torchrun"):
            return [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
        return argv

    def run(self, spec: StageSpec, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> int:
        with self._lock:
            self._proc = subprocess.Popen(
                self.resolve(argv),
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        proc = self._proc
        timer = threading.Timer(spec.timeout_s, self._timeout)
        timer.daemon = True
        timer.start()
        self._timed_out = False
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            timer.cancel()
        if self._timed_out:
            raise StageTimeout(f"stage {spec.command} exceeded its timeout of {spec.timeout_s}s and was stopped")
        return rc

    def _timeout(self) -> None:
        self._timed_out = True
        self.stop()

    def stop(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + self.grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
