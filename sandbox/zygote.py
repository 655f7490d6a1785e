"""The pre-started worker ("zygote"): an interpreter that has already paid for startup, namespaces and
imports. It supervises every job from one poll loop; its fork template (`sandbox.template`, forked once at
startup, warmed and frozen) forks one process per job.

Started by `sandbox.pool` as `python -I -S -c ...` with a scrubbed environment and without running
`sandbox/__init__.py` (the host-side modules would only make every fork slower). The first process (the
shim) unshares the namespaces and forks; its child is pid 1 of the new pid namespace and is the worker
proper. The shim only waits, so the host's Popen handle lives exactly as long as the worker. The worker
exits when the host closes the control socket (or dies), and, as pid 1, takes every job down with it.

    host --socket--> shim (waits) -> worker: pid 1, supervises --seqpacket--> template: forks
                                                                                   -> job (pid 1 of its own ns)
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import sys
import time
import traceback
from typing import Any

from sandbox import harness, isolation, supervisor, template, values, wire  # noqa: F401 - every job inherits them
from sandbox.supervisor import Supervisor

# Preloaded once so that a job's `import math` / `from typing import List` costs nothing. Kept small on
# purpose: fork time grows with the worker's resident memory.
_WARM = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "operator", "typing")


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"sandbox worker: {msg}\n")
        sys.stderr.flush()
    except OSError:
        pass


def _become_worker(sock: socket.socket, config: dict[str, Any]) -> dict[str, Any]:
    """Namespaces and filesystem; returns the features in force. In the shim this never returns."""
    features: dict[str, Any] = {"namespaces": False}
    if not config.get("no_namespaces"):
        features = isolation.enter_namespaces()
    if features.get("namespaces"):
        pid = os.fork()
        if pid:  # the shim
            sock.close()
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
            os._exit(os.waitstatus_to_exitcode(status) & 0x7F)
        isolation.set_parent_death_signal()  # the host killed the shim: take the namespace down with us
        # what jobs still need to see: the interpreter and its libraries (not the project: every sandbox
        # module the worker needs is already imported)
        keep = [
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            os.path.dirname(sys.executable),
            os.path.dirname(os.path.realpath(sys.executable)),
            *config.get("site_packages", []),
            *[p for p in sys.path if p and os.path.isabs(p)],
        ]
        try:
            features.update(isolation.setup_filesystem(keep, int(config.get("tmp_size_mb", 1024))))
        except OSError as exc:
            features["fs_error"] = str(exc)
    return features


def _work_base(features: dict[str, Any]) -> str:
    if features.get("private_tmp"):
        path = "/tmp/sandbox-jobs"
        os.makedirs(path, exist_ok=True)
    else:
        import tempfile  # only here: every module the worker imports makes each fork a little slower

        path = tempfile.mkdtemp(prefix="posttrain-sandbox-")
    os.chmod(path, 0o711)  # jobs may enter their own dir, not list the others
    return path


def _interpreter_readable(uid: int | None) -> bool:
    """Can a job's uid still read the standard library (not everything is preloaded)? A Python installed
    under a private home directory would otherwise make lazy imports fail in every job."""
    if uid is None:
        return True
    probe = os.path.dirname(os.__file__)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.listdir(probe)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def main(sock_fd: int, config_json: str) -> None:
    config = json.loads(config_json)
    sock = socket.socket(fileno=sock_fd)
    try:
        features = _become_worker(sock, config)
        ctx: dict[str, Any] = {"work_base": _work_base(features), "uid_base": None, "drop_caps": False, "pidns": False}
        pidns = None
        if features.get("namespaces"):
            try:
                pidns = isolation.PidNamespaceFactory()
                ctx["pidns"] = True
            except OSError as exc:
                features["pidns_error"] = str(exc)
        if features.get("userns"):
            ctx["drop_caps"] = True
        elif os.geteuid() == 0:
            ctx["uid_base"] = isolation.pick_uid_base(int(config["max_slots"]))
        features["uid"] = ctx["uid_base"] is not None
        features["per_job_pidns"] = ctx["pidns"]
        features["interpreter_readable"] = _interpreter_readable(ctx["uid_base"])
        for path in config.get("site_packages", []):
            if path not in sys.path:
                sys.path.append(path)
        for name in _WARM:
            try:
                __import__(name)
            except ImportError:
                pass
        isolation.prepare_worker()
        devnull = os.open(os.devnull, os.O_WRONLY)
        harness.warm_up(devnull)
        os.close(devnull)
        ctx["vm_base"] = isolation.vm_size_bytes() + 16 * 1024 * 1024  # slack: the job's own bookkeeping
        if not ctx["pidns"]:
            isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)  # orphans come back to us, not to init
        to_template = _start_template(sock, ctx, pidns)
        wire.send(
            sock, {"ready": True, "features": features, "uid_base": ctx["uid_base"], "work_base": ctx["work_base"]}
        )
    except BaseException as exc:  # noqa: BLE001
        _log(traceback.format_exc())
        try:
            wire.send(sock, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(1)
    _Worker(sock, to_template, ctx).serve()


def _start_template(
    sock: socket.socket, ctx: dict[str, Any], pidns: isolation.PidNamespaceFactory | None
) -> socket.socket:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    gc.collect()
    gc.freeze()  # in the template: keep the collector from touching (and so copying) the heap in every job
    pid = os.fork()
    if pid == 0:
        sock.close()
        ours.close()
        template.template_main(theirs, ctx, pidns)
    gc.unfreeze()
    theirs.close()
    return ours


class _Worker:
    """The supervising loop: host requests in, reports out; the template forks, we watch."""

    def __init__(self, sock: socket.socket, to_template: socket.socket, ctx: dict[str, Any]) -> None:
        self.sock, self.tpl, self.ctx = sock, to_template, ctx
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.poller.register(to_template.fileno(), select.POLLIN)
        self.owner: dict[int, Supervisor] = {}  # job pipe -> its job
        self.writing: dict[int, Supervisor] = {}  # request pipe (POLLOUT) -> its job
        self.jobs: dict[str, Supervisor] = {}  # job id -> job
        self.starting: dict[int, Supervisor] = {}  # token -> job the template has not forked yet
        self.by_pid: dict[int, Supervisor] = {}
        self.outgoing: dict[int, memoryview] = {}  # report fd -> bytes still to write
        self.next_token = 1

    def serve(self) -> None:
        sock_fd, tpl_fd = self.sock.fileno(), self.tpl.fileno()
        while True:
            now = time.monotonic()
            timeout = 0.5
            for sup in self.jobs.values():
                timeout = min(timeout, sup.next_deadline() - now)
            for fd, _ev in self.poller.poll(max(0.0, timeout) * 1000):
                if fd == sock_fd:
                    if not self._control():
                        return self._shutdown()
                elif fd == tpl_fd:
                    if not self._from_template():
                        _log("the fork template died")
                        return self._shutdown()
                elif fd in self.outgoing:
                    self._flush(fd)
                elif fd in self.writing:
                    sup = self.writing.pop(fd)
                    self.poller.unregister(fd)
                    if not sup.write_request():
                        self.writing[fd] = sup
                        self.poller.register(fd, select.POLLOUT)
                elif fd in self.owner:
                    sup = self.owner[fd]
                    sup.readable(fd)
                    if fd not in sup.open_fds:
                        self._forget(fd)
            now = time.monotonic()
            for job_id, sup in list(self.jobs.items()):
                sup.tick(now)
                if sup.finished:
                    del self.jobs[job_id]
                    self._finish(sup)
            supervisor.reap_children()

    def _forget(self, fd: int) -> None:
        if self.owner.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def _from_template(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.tpl, 64, 1)
        except OSError:
            return False
        if not data:
            return False
        kind, token, pid, status, cpu_s, rss = template.MSG.unpack(data)
        if kind == b"F":
            sup = self.starting.pop(token, None)
            pidfd = fds[0] if fds else None
            if sup is None:  # cannot happen; do not leak the fd
                if pidfd is not None:
                    os.close(pidfd)
                return True
            sup.started(pid, pidfd)
            self.by_pid[pid] = sup
        elif kind == b"E":
            sup = self.starting.pop(token, None)
            if sup is not None:
                sup.failed_to_start(os.strerror(status) if status else "fork failed")
        elif kind == b"X":
            sup = self.by_pid.pop(pid, None)
            if sup is not None:
                sup.exited(status, cpu_s, rss)
        return True

    def _control(self) -> bool:
        try:
            got = wire.recv(self.sock)
        except (OSError, ValueError) as exc:
            _log(f"control socket: {exc}")
            return False
        if got is None:
            return False  # the host is gone or closed the pool
        msg, fds = got
        adopted = False
        try:
            if msg.get("op") == "run" and len(fds) == 1:
                adopted = self._start(msg, fds[0])
            elif msg.get("op") == "kill":
                sup = self.jobs.get(msg.get("id"))
                if sup is not None:
                    sup.kill()
            else:
                _log(f"bad request {msg.get('op')!r} with {len(fds)} fds")
        except Exception:  # noqa: BLE001 - one bad request must not take the worker down
            _log(traceback.format_exc())
        if not adopted:
            for fd in fds:
                os.close(fd)
        return True

    def _start(self, msg: dict[str, Any], report_fd: int) -> bool:
        try:
            sup = Supervisor(msg, report_fd, self.ctx)
        except Exception as exc:  # noqa: BLE001 - reported to the host as ERROR
            self._send_report(report_fd, json.dumps({"error": f"worker could not start the job: {exc}"}).encode())
            return True
        token = self.next_token
        self.next_token += 1
        self.starting[token] = sup
        self.jobs[msg["id"]] = sup
        socket.send_fds(self.tpl, [template.REQUEST.pack(token)], list(sup.child_fds))
        for fd in sup.fds():
            self.owner[fd] = sup
            self.poller.register(fd, select.POLLIN)
        if not sup.write_request():
            self.writing[sup.request_fd] = sup
            self.poller.register(sup.request_fd, select.POLLOUT)
        return True

    def _finish(self, sup: Supervisor) -> None:
        for fd in sup.fds():
            self._forget(fd)
        if sup.request_fd >= 0 and self.writing.pop(sup.request_fd, None) is not None:
            self.poller.unregister(sup.request_fd)
        try:
            report = sup.close()
        except Exception as exc:  # noqa: BLE001
            report = json.dumps({"error": f"worker: {type(exc).__name__}: {exc}"}).encode()
        self._send_report(sup.report_fd, report)

    def _send_report(self, fd: int, data: bytes) -> None:
        os.set_blocking(fd, False)  # a host that reads slowly must not stall every other job
        self.outgoing[fd] = memoryview(data)
        self.poller.register(fd, select.POLLOUT)
        self._flush(fd)

    def _flush(self, fd: int) -> None:
        view = self.outgoing[fd]
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BlockingIOError:
            self.outgoing[fd] = view
            return
        except OSError:  # the host stopped listening for this job
            pass
        del self.outgoing[fd]
        self.poller.unregister(fd)
        os.close(fd)

    def _shutdown(self) -> None:
        for sup in self.jobs.values():
            sup.kill()
        self.tpl.close()  # the template exits on EOF; as pid 1 we take every job down when we exit
        for sup in self.jobs.values():
            sup.status = sup.status if sup.status is not None else 0
            sup.close()
        if not self.ctx["work_base"].startswith("/tmp/sandbox-jobs"):
            import shutil

            shutil.rmtree(self.ctx["work_base"], ignore_errors=True)
        os._exit(0)
