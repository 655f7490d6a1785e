"""Host side: start the worker, hand it jobs, collect reports, turn them into Verdicts.

A Pool is thread-safe: several threads (an HTTP server, reward workers) may call run_batch at once; the
pool never has more than `max_slots` jobs in flight, and each in-flight job holds a slot, which is also
its uid (uid_base + slot) when running as root, so concurrent jobs cannot signal or read each other.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sandbox import wire
from sandbox.spec import IsolationLevel, Job, Verdict
from sandbox.verdict import error_verdict, make_verdict

ENV_ALLOW_UNISOLATED = "POSTTRAIN_SANDBOX_ALLOW_UNISOLATED"
ENV_PYTHON = "POSTTRAIN_SANDBOX_PYTHON"
# `-I -S`: no environment, no site hooks (.pth files, editable-install finders). A bare package module
# stands in for `sandbox`, so the worker imports only its own modules and never sandbox/__init__.py.
_BOOT = (
    "import sys, types; p = types.ModuleType('sandbox'); p.__path__ = [sys.argv[1] + '/sandbox']; "
    "sys.modules['sandbox'] = p; from sandbox.zygote import main; main(int(sys.argv[2]), sys.argv[3])"
)
_BACKSTOP_S = 10.0  # beyond the job's wall budget, before the host gives up on a supervisor


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot provide the isolation asked for (or cannot start at all)."""


def _env_allows_unisolated() -> bool:
    return os.environ.get(ENV_ALLOW_UNISOLATED, "").strip().lower() in ("1", "true", "yes")


def level_from_features(features: dict[str, Any]) -> IsolationLevel:
    if not features.get("namespaces"):
        return IsolationLevel.RLIMITS_ONLY
    if features.get("uid") and features.get("per_job_pidns") and features.get("proc"):
        return IsolationLevel.NAMESPACES_UID
    return IsolationLevel.NAMESPACES


def _site_packages() -> list[str]:
    """Where jobs may import third-party packages from (read-only): the host interpreter's own."""
    try:
        import site

        return [p for p in site.getsitepackages() if os.path.isdir(p)]
    except (AttributeError, ImportError):
        return []


class _Flight:
    __slots__ = ("job", "index", "slot", "fd", "buf", "deadline", "nonce")

    def __init__(self, job: Job, index: int, slot: int, fd: int, deadline: float, nonce: str) -> None:
        self.job, self.index, self.slot, self.fd = job, index, slot, fd
        self.buf = bytearray()
        self.deadline = deadline
        self.nonce = nonce


class Pool:
    """A pre-started worker pool. `with Pool() as pool: pool.run_batch(jobs)`.

    allow_unisolated: run even when no network namespace can be created (rlimits only). Defaults to the
    POSTTRAIN_SANDBOX_ALLOW_UNISOLATED environment variable; otherwise such a pool refuses to start.
    no_namespaces: skip namespaces on purpose (tests of the fallback); implies the unisolated level.
    """

    def __init__(
        self,
        max_slots: int = 64,
        *,
        allow_unisolated: bool | None = None,
        no_namespaces: bool = False,
        tmp_size_mb: int = 1024,
        start_timeout_s: float = 30.0,
    ) -> None:
        if max_slots < 1:
            raise ValueError("max_slots must be >= 1")
        self.max_slots = max_slots
        self.allow_unisolated = _env_allows_unisolated() if allow_unisolated is None else allow_unisolated
        self.no_namespaces = no_namespaces
        self.tmp_size_mb = tmp_size_mb
        self.start_timeout_s = start_timeout_s
        self._lock = threading.RLock()  # start/stop and socket writes
        self._slots_cv = threading.Condition()
        self._free_slots = list(range(max_slots - 1, -1, -1))
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._log: Any = None
        self.features: dict[str, Any] = {}
        self.isolation: IsolationLevel | None = None
        self.uid_base: int | None = None
        self._closed = False
        self._pid = os.getpid()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Pool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pid(self) -> int | None:
        """Host pid of the shim process (the worker is its only child)."""
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _after_fork(self) -> None:
        """In a forked copy of the owning process (multiprocessing, a data loader): the worker and its
        socket belong to the parent. Drop our copies without disturbing it, and start our own."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._lock = threading.RLock()  # may have been held by a thread that does not exist here
        self._slots_cv = threading.Condition()
        self._free_slots = list(range(self.max_slots - 1, -1, -1))
        if self._sock is not None:
            self._sock.close()  # only this process's copy: the parent's worker sees no EOF
        self._sock = self._proc = self._log = None
        self.isolation = None

    def start(self) -> IsolationLevel:
        self._after_fork()
        with self._lock:
            if self._closed:
                raise SandboxUnavailable("pool is closed")
            if self.alive():
                assert self.isolation is not None
                return self.isolation
            self._stop_worker()
            return self._start_worker()

    def _start_worker(self) -> IsolationLevel:
        python = os.environ.get(ENV_PYTHON) or sys.executable
        parent = str(Path(__file__).resolve().parent.parent)
        config = {
            "max_slots": self.max_slots,
            "package_parent": parent,
            "tmp_size_mb": self.tmp_size_mb,
            "no_namespaces": self.no_namespaces,
            "site_packages": _site_packages(),
        }
        host_sock, worker_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._log = tempfile.TemporaryFile(prefix="posttrain-sandbox-log-")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # no host secrets reach the worker
        try:
            self._proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _BOOT, parent, str(worker_sock.fileno()), json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                env=env,
                pass_fds=[worker_sock.fileno()],
                start_new_session=True,
                cwd="/",
            )
        except OSError as exc:
            host_sock.close()
            raise SandboxUnavailable(f"cannot start the sandbox worker with {python}: {exc}") from exc
        finally:
            worker_sock.close()
        self._sock = host_sock
        host_sock.settimeout(self.start_timeout_s)
        try:
            got = wire.recv(host_sock)
        except (OSError, ValueError) as exc:
            got = None
            reason = str(exc)
        else:
            reason = "worker exited during startup"
        host_sock.settimeout(None)
        if got is None or not got[0].get("ready"):
            if got is not None:
                reason = got[0].get("error", reason)
            log = self._read_log()
            self._stop_worker()
            raise SandboxUnavailable(f"sandbox worker failed to start: {reason}" + (f"\n{log}" if log else ""))
        msg = got[0]
        self.features = msg["features"]
        self.uid_base = msg.get("uid_base")
        level = level_from_features(self.features)
        if not level.network_isolated and not self.allow_unisolated:
            self._stop_worker()
            raise SandboxUnavailable(
                "no network isolation available (cannot create a network namespace: "
                f"{self.features.get('namespace_error', 'namespaces disabled')}); refusing to run untrusted code. "
                f"Pass allow_unisolated=True or set {ENV_ALLOW_UNISOLATED}=1 to run with rlimits only, "
                "or use the Docker backend."
            )
        self.isolation = level
        return level

    def _read_log(self) -> str:
        try:
            self._log.seek(0)
            return self._log.read()[-4000:].decode(errors="replace").strip()
        except (OSError, AttributeError, ValueError):
            return ""

    def _stop_worker(self) -> None:
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        if sock is not None:
            try:
                sock.close()  # the worker exits on EOF, and its namespaces with it
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop_worker()

    # ------------------------------------------------------------------ slots

    def _take_slot(self, block: bool) -> int | None:
        with self._slots_cv:
            while not self._free_slots:
                if not block:
                    return None
                self._slots_cv.wait()
            return self._free_slots.pop()

    def _give_slot(self, slot: int) -> None:
        with self._slots_cv:
            self._free_slots.append(slot)
            self._slots_cv.notify()

    # ------------------------------------------------------------------ running

    def run(self, job: Job) -> Verdict:
        return self.run_batch([job], concurrency=1)[0]

    def run_batch(self, jobs: Iterable[Job], concurrency: int | None = None) -> list[Verdict]:
        """Run jobs with at most `concurrency` in flight; verdicts in input order. The default, twice the CPU
        count, keeps the CPUs busy while some jobs are between the host, the worker and the template."""
        jobs = list(jobs)
        for i, job in enumerate(jobs):
            if not isinstance(job, Job):
                raise TypeError(f"jobs[{i}] is {type(job).__name__}, not a sandbox.Job")
        if not jobs:
            return []
        level = self.start()
        concurrency = max(1, min(concurrency or 2 * (os.cpu_count() or 1), self.max_slots))
        verdicts: list[Verdict | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        flights: dict[int, _Flight] = {}
        sel = selectors.DefaultSelector()
        try:
            while pending or flights:
                while pending and len(flights) < concurrency:
                    slot = self._take_slot(block=not flights)
                    if slot is None:
                        break
                    index = pending.pop()
                    flight = self._submit(jobs[index], index, slot, level)
                    if isinstance(flight, Verdict):
                        verdicts[index] = flight
                        self._give_slot(slot)
                        continue
                    flights[flight.fd] = flight
                    sel.register(flight.fd, selectors.EVENT_READ)
                if not flights:
                    continue
                now = time.monotonic()
                timeout = max(0.0, min(f.deadline for f in flights.values()) - now)
                for key, _ in sel.select(timeout):
                    flight = flights[key.fd]
                    try:
                        chunk = os.read(key.fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    if chunk:
                        flight.buf += chunk
                        continue
                    sel.unregister(key.fd)
                    del flights[key.fd]
                    verdicts[flight.index] = self._finish(flight, level)
                now = time.monotonic()
                for fd, flight in list(flights.items()):
                    if now >= flight.deadline:
                        self._send({"op": "kill", "id": flight.nonce})
                        sel.unregister(fd)
                        del flights[fd]
                        os.close(fd)
                        self._give_slot(flight.slot)
                        verdicts[flight.index] = error_verdict(
                            flight.job, level, "the sandbox supervisor did not report in time (killed)"
                        )
        finally:
            for fd, flight in flights.items():  # only on an exception: do not leak slots or fds
                os.close(fd)
                self._give_slot(flight.slot)
            sel.close()
        return [v for v in verdicts if v is not None]

    def _send(self, msg: dict[str, Any], fds: list[int] | None = None) -> bool:
        with self._lock:
            if self._sock is None:
                return False
            try:
                wire.send(self._sock, msg, fds)
                return True
            except OSError:
                return False

    def _submit(self, job: Job, index: int, slot: int, level: IsolationLevel) -> _Flight | Verdict:
        limits = job.effective_limits
        nonce = secrets.token_hex(16)
        request = {"op": "run", "id": nonce, "slot": slot, "nonce": nonce, **job.request()}  # no expected values
        for attempt in range(2):
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            try:
                sent = self._send(request, [write_fd])
            finally:
                os.close(write_fd)
            if sent:
                os.set_blocking(read_fd, False)
                return _Flight(job, index, slot, read_fd, time.monotonic() + limits.wall_s + _BACKSTOP_S, nonce)
            os.close(read_fd)
            if attempt == 0:  # the worker died (or was killed): restart once, the job never started
                try:
                    level = self.start()
                except SandboxUnavailable as exc:
                    return error_verdict(job, level, str(exc))
        return error_verdict(job, level, "cannot reach the sandbox worker")

    def _finish(self, flight: _Flight, level: IsolationLevel) -> Verdict:
        os.close(flight.fd)
        self._give_slot(flight.slot)
        if not flight.buf:
            return error_verdict(flight.job, level, "the sandbox worker died before reporting")
        try:
            report = json.loads(flight.buf)
        except ValueError:
            return error_verdict(flight.job, level, "unreadable report from the sandbox supervisor")
        return make_verdict(flight.job, report, flight.nonce, level)


# ---------------------------------------------------------------------- the process-wide default pool

_default: Pool | None = None
_default_lock = threading.Lock()


def default_pool(allow_unisolated: bool | None = None) -> Pool:
    """The shared pool behind `sandbox.run` / `sandbox.run_batch`, started on first use."""
    global _default
    allowed = _env_allows_unisolated() if allow_unisolated is None else allow_unisolated
    with _default_lock:
        if _default is None or _default._closed:
            pool = Pool(allow_unisolated=allowed)
            pool.start()  # raises SandboxUnavailable when it would be unisolated and that is not allowed
            _default = pool
        elif _default.isolation is not None and not _default.isolation.network_isolated and not allowed:
            raise SandboxUnavailable(
                "the default sandbox pool runs without network isolation; "
                f"pass allow_unisolated=True or set {ENV_ALLOW_UNISOLATED}=1"
            )
        return _default


def shutdown_default_pool() -> None:
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None


atexit.register(shutdown_default_pool)


def run(job: Job, *, allow_unisolated: bool | None = None) -> Verdict:
    """Run one job in the shared pool."""
    return default_pool(allow_unisolated).run(job)


def run_batch(
    jobs: Sequence[Job], concurrency: int | None = None, *, allow_unisolated: bool | None = None
) -> list[Verdict]:
    """Run many jobs in the shared pool, at most `concurrency` at once; verdicts in input order."""
    return default_pool(allow_unisolated).run_batch(jobs, concurrency)


__all__ = ["Pool", "SandboxUnavailable", "default_pool", "run", "run_batch", "shutdown_default_pool"]
