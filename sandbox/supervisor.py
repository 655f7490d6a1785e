"""One job as the worker sees it, and the job process itself.

`Supervisor` is the worker's view of one job: the pipes it made (request in; stdout, stderr and results
out), the caps it reads them with, the wall budget it kills on, and the JSON report it produces for the
host. The process is started elsewhere (the fork template, `sandbox.template`, or a plain fork in a
container) and reported back through `started` / `exited`.

`job_main` is the job process: it reads its request from a pipe, enters the private work dir the worker made
for it, confines itself and runs the harness. With namespaces it is pid 1 of its own pid namespace: when it
exits, the kernel kills every process it left behind. The report carries the raw result bytes; the host
decodes and compares them, so expected values never come here either.
"""

from __future__ import annotations

import base64
import json
import marshal
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any, NoReturn

from sandbox import harness, isolation

RESULT_FD = 3
TEST_FD = 4  # test-program jobs: the rest of the request (the test program), read by the test process
DRAIN_S = 0.5  # after the job process exits: how long leftover writers may keep its pipes open
_READ = 65536


def close_fds_except(keep: int, keep_too: int | None = None) -> None:
    """Close every fd above 2 except `keep` (and `keep_too`, the fd right after it) (close_range(2) makes the
    wide range cheap)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    top = hard if 0 < hard < 1 << 20 else 1 << 20
    os.closerange(3, keep)
    os.closerange((keep_too if keep_too is not None else keep) + 1, top)


def workdir_for(ctx: dict[str, Any], request: dict[str, Any]) -> str:
    return os.path.join(ctx["work_base"], f"job-{int(request['slot'])}-{request['nonce'][:16]}")


def uid_for(ctx: dict[str, Any], request: dict[str, Any]) -> int | None:
    return ctx["uid_base"] + int(request["slot"]) if ctx.get("uid_base") is not None else None


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_exact(fd: int, n: int) -> bytes:
    data = os.read(fd, n)
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("request cut short")
        data += chunk
    return data


def read_test_program(fd: int) -> dict[str, Any]:
    """The rest of the request: the test program (see `Supervisor.__init__`)."""
    data = _read_all(fd)
    os.close(fd)
    return marshal.loads(data)


def job_main(out_w: int, err_w: int, res_w: int, req_r: int, ctx: dict[str, Any]) -> NoReturn:
    """The job process (a fork of the template). Never returns: unwinding into the parent's stack would
    run the parent's loop with the job's privileges."""
    err_fd = err_w  # until fd 2 is the job's stderr pipe
    try:
        try:
            os.setsid()  # own session and process group: one killpg reaches everything it starts
            # written by the worker: trusted, and cheap to load
            request = marshal.loads(_read_exact(req_r, int.from_bytes(_read_exact(req_r, 4), "big")))
            uid, workdir = request["uid"], request["workdir"]  # made by the worker: less to do (and fault) here
            if request["test_program"]:  # the test program is still in the pipe: keep it, above fds 0..TEST_FD
                import fcntl

                req_r = fcntl.fcntl(req_r, fcntl.F_DUPFD, TEST_FD + 1)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.dup2(res_w, RESULT_FD)
            err_fd = 2
            if request["test_program"]:
                os.dup2(req_r, TEST_FD)
                close_fds_except(RESULT_FD, TEST_FD)
            else:
                close_fds_except(RESULT_FD)  # the worker's sockets, other jobs' pipes: none may reach the job
            isolation.confine(
                request["limits"],
                workdir,
                uid,
                ctx["drop_caps"],
                ctx["pidns"],
                ctx["vm_base"],
                ctx.get("nproc_rlimit", True),
            )
            if "random" in sys.modules:  # forked from one template: else every job draws the same numbers
                sys.modules["random"].seed()
        except BaseException:  # noqa: BLE001 - no start frame follows, so the host reports ERROR
            os.write(err_fd, ("sandbox: job setup failed\n" + traceback.format_exc(limit=5)).encode()[-4000:])
            os._exit(127)
        if request["test_program"]:
            harness.run_test_program(
                request["program"],
                TEST_FD,
                read_test_program,
                request["nonce"],
                RESULT_FD,
                request["limits"]["max_result_bytes"],
            )
        harness.run(
            request["program"], request["calls"], request["nonce"], RESULT_FD, request["limits"]["max_result_bytes"]
        )
    finally:
        os._exit(126)  # only reached if the program broke the harness itself (no done frame: no pass)


class Supervisor:
    """State of one job inside the worker. The worker polls `fds()` (POLLIN) and `request_fd` (POLLOUT),
    calls `readable(fd)` / `write_request()`, `started(pid, pidfd)` and `exited(...)` when the template
    reports, and `tick(now)` for the deadline; `finished` turns true once `close()` can build the report."""

    def __init__(self, request: dict[str, Any], report_fd: int, ctx: dict[str, Any]) -> None:
        self.request, self.report_fd, self.ctx = request, report_fd, ctx
        self.limits = request["limits"]
        self.uid = uid_for(ctx, request)
        self.workdir = workdir_for(ctx, request)
        os.mkdir(self.workdir, 0o700)
        pipes: list[tuple[int, int]] = []
        try:
            if self.uid is not None:
                os.chown(self.workdir, self.uid, self.uid)
            test_program = request.get("test_program")
            head = marshal.dumps(
                {
                    "uid": self.uid,
                    "workdir": self.workdir,
                    "nonce": request["nonce"],
                    "program": request["program"],
                    "calls": request["calls"],
                    "test_program": test_program is not None,
                    "limits": self.limits,
                }
            )
            # The test program follows the head and is read only by the test process, after it forked the
            # candidate: candidate code never has the tests (and their expected values) in its memory.
            payload = len(head).to_bytes(4, "big") + head + (marshal.dumps(test_program) if test_program else b"")
            for _ in range(4):
                pipes.append(os.pipe2(os.O_CLOEXEC))
        except BaseException:
            for fd in (fd for pair in pipes for fd in pair):
                os.close(fd)
            os.rmdir(self.workdir)
            raise
        (self.out_r, out_w), (self.err_r, err_w), (self.res_r, res_w), (req_r, self.request_fd) = pipes
        self.child_fds: tuple[int, ...] = (out_w, err_w, res_w, req_r)
        os.set_blocking(self.request_fd, False)
        self.pending = memoryview(payload)
        self.keep = {
            self.out_r: self.limits["max_output_bytes"],
            self.err_r: self.limits["max_output_bytes"],
            self.res_r: self.limits["max_result_bytes"],
        }
        self.bufs = {fd: bytearray() for fd in self.keep}
        self.seen = dict.fromkeys(self.keep, 0)
        self.open_fds = set(self.keep)
        for fd in self.open_fds:
            os.set_blocking(fd, False)
        self.start = time.monotonic()
        self.deadline = self.start + float(self.limits["wall_s"])
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.drain_until: float | None = None
        self.status: int | None = None
        self.cpu_s: float | None = None
        self.max_rss_kb: int | None = None
        self.end: float | None = None
        self.timed_out = self.output_limit = self.result_overflow = self.kill_pending = False
        self.start_error: str | None = None

    # -------------------------------------------------------------- events

    def fds(self) -> list[int]:
        return list(self.open_fds)

    def started(self, pid: int, pidfd: int | None) -> None:
        self.pid, self.pidfd = pid, pidfd
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()
        if self.kill_pending:
            self.kill()

    def failed_to_start(self, reason: str) -> None:
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()
        self.start_error = reason
        self.status, self.end = 0, time.monotonic()
        self.open_fds.clear()

    def write_request(self) -> bool:
        """Write more of the request; True once it is all written (or the job is gone) and the fd closed."""
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.request_fd, self.pending) :]
        except BlockingIOError:
            return False
        except OSError:
            pass  # the job died before reading it all
        os.close(self.request_fd)
        self.request_fd = -1
        return True

    def readable(self, fd: int) -> None:
        try:
            chunk = os.read(fd, _READ)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.open_fds.discard(fd)
            return
        self.seen[fd] += len(chunk)
        room = self.keep[fd] - len(self.bufs[fd])
        if room > 0:
            self.bufs[fd] += chunk[:room]
        if self.status is None:
            if (
                self.seen[self.out_r] + self.seen[self.err_r] > self.limits["output_kill_bytes"]
                and not self.output_limit
            ):
                self.output_limit = True
                self.kill()
            if self.seen[self.res_r] > self.limits["max_result_bytes"] and not self.result_overflow:
                self.result_overflow = True
                self.kill()

    def exited(self, status: int, cpu_s: float | None, max_rss_kb: int | None) -> None:
        self.status, self.cpu_s, self.max_rss_kb, self.end = status, cpu_s, max_rss_kb, time.monotonic()
        if not self.ctx["pidns"]:
            self._kill_leftovers()  # with a pid namespace the kernel already did
        self.drain_until = self.end + DRAIN_S

    def tick(self, now: float) -> None:
        if self.status is None and now >= self.deadline and not self.timed_out:
            self.timed_out = True
            self.kill()

    def next_deadline(self) -> float:
        return self.deadline if self.status is None else (self.drain_until or 0.0)

    @property
    def finished(self) -> bool:
        return self.status is not None and (not self.open_fds or time.monotonic() >= (self.drain_until or 0.0))

    # -------------------------------------------------------------- killing

    def kill(self) -> None:
        if self.pid is None:
            self.kill_pending = True  # not forked yet: kill as soon as it is
            return
        # as pid 1 of its namespace, SIGKILL from outside takes the whole namespace down; a pidfd cannot
        # hit a recycled pid
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if not self.ctx["pidns"]:
            self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        """Without a pid namespace: the job's process group, then (as root) every process of its uid."""
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.uid is not None:
            for _ in range(20):
                pids = [p for p in _pids_of_uid(self.uid) if p != self.pid]
                if not pids:
                    break
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass

    # -------------------------------------------------------------- the end

    def close(self) -> bytes:
        """Release everything and return the report (JSON bytes)."""
        for fd in [*self.keep, *self.child_fds, self.request_fd, self.pidfd]:
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        _remove_tree(self.workdir)
        if self.start_error is not None:
            return json.dumps({"error": f"worker could not start the job: {self.start_error}"}).encode()
        status = self.status or 0
        report: dict[str, Any] = {
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timed_out": self.timed_out,
            "output_limit": self.output_limit,
            "result_overflow": self.result_overflow,
            "wall_s": round((self.end or time.monotonic()) - self.start, 6),
            "cpu_s": round(self.cpu_s, 6) if self.cpu_s is not None else None,
            "max_rss_kb": self.max_rss_kb,
            "results": base64.b64encode(bytes(self.bufs[self.res_r])).decode("ascii"),
        }
        for name, fd in (("stdout", self.out_r), ("stderr", self.err_r)):
            report[name] = self.bufs[fd].decode("utf-8", errors="replace")
            report[f"{name}_truncated"] = self.seen[fd] > len(self.bufs[fd])
        return json.dumps(report).encode()


def run_single(request: dict[str, Any], ctx: dict[str, Any]) -> bytes:
    """One job without a worker loop (the container entry point): fork, feed, watch, report."""
    import select

    sup = Supervisor(request, -1, ctx)
    pid = os.fork()
    if pid == 0:
        os.close(sup.request_fd)  # else the job waits forever for the end of its own request
        out_w, err_w, res_w, req_r = sup.child_fds  # all four: `started` (which empties it) has not run yet
        job_main(out_w, err_w, res_w, req_r, ctx)
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    sup.started(pid, pidfd)
    poller = select.poll()
    for fd in sup.fds():
        poller.register(fd, select.POLLIN)
    if not sup.write_request():
        poller.register(sup.request_fd, select.POLLOUT)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while not sup.finished:
        wait = max(0.0, min(sup.next_deadline() - time.monotonic(), 0.5 if pidfd is not None else 0.01))
        for fd, _ev in poller.poll(wait * 1000):
            if fd == sup.request_fd:
                poller.unregister(fd)
                if not sup.write_request():
                    poller.register(sup.request_fd, select.POLLOUT)
            elif fd == pidfd:
                poller.unregister(fd)
            else:
                sup.readable(fd)
                if fd not in sup.open_fds:
                    poller.unregister(fd)
        sup.tick(time.monotonic())
        if sup.status is None:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                sup.exited(status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
    return sup.close()


def container_main(request: dict[str, Any]) -> None:
    """Entry point inside a container (see sandbox.docker_backend): the container is the isolation; this
    process supervises the job exactly as the worker does and writes the report to its real stdout."""
    report_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # the job (same uid) cannot reach our fds via /proc
    isolation.prepare_worker()
    ctx = {
        "work_base": os.getcwd(),
        "uid_base": None,
        "drop_caps": False,
        "pidns": False,
        "vm_base": isolation.vm_size_bytes() + 16 * 1024 * 1024,
        "nproc_rlimit": False,
    }
    try:
        report = run_single(request, ctx)
    except Exception as exc:  # noqa: BLE001
        report = json.dumps({"error": f"container supervisor: {type(exc).__name__}: {exc}"}).encode()
    view = memoryview(report)
    while view:
        view = view[os.write(report_fd, view) :]
    os._exit(0)


def _pids_of_uid(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except OSError:
                pass
    return out


def _remove_tree(path: str) -> None:
    """The usual work dir is empty or nearly so: remove it inline. A big tree (a job that made thousands
    of files) is moved aside and removed by a forked helper, so one job cannot stall the worker's loop."""
    import shutil  # rarely needed; not worth resident memory in the template

    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    try:
        with os.scandir(path) as it:
            entries = [e for _, e in zip(range(65), it)]
        if len(entries) <= 64 and not any(e.is_dir(follow_symlinks=False) for e in entries):
            shutil.rmtree(path, ignore_errors=True)
            return
        trash = path + ".trash"
        os.rename(path, trash)
        if os.fork() == 0:  # reaped by reap_children
            close_fds_except(2)  # must not hold the control socket or any job's pipes open
            shutil.rmtree(trash, ignore_errors=True)
            os._exit(0)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def reap_children() -> None:
    """Reap whatever has exited below the worker: cleaners, and orphans re-parented to it (it is pid 1 of
    its namespace, or a child subreaper without namespaces)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
