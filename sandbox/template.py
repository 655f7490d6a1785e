"""The fork template: a warmed, frozen interpreter whose only work is to fork job processes.

Why a separate process: after every fork, each memory page the parent writes costs it a copy-on-write
fault, and on a virtual machine a fault is several microseconds. The worker's loop (parsing requests,
reading pipes, building reports) touches hundreds of pages per job; this loop touches a handful. So the
worker supervises, and asks the template to fork.

Protocol on a SOCK_SEQPACKET pair (one message per datagram, fds attached):
  worker -> template: token (!Q) + fds [stdout_w, stderr_w, result_w, request_r]
  template -> worker: MSG = kind, token, pid, status, cpu_s, max_rss_kb
     b"F" forked (pidfd attached when the kernel has pidfd_open), b"E" fork failed (status = errno),
     b"X" exited (status as from wait4).
"""

from __future__ import annotations

import os
import select
import socket
import struct
from typing import Any, NoReturn

from sandbox import isolation
from sandbox.supervisor import job_main

REQUEST = struct.Struct("!Q")
MSG = struct.Struct("!cQiidq")


def template_main(ctl: socket.socket, ctx: dict[str, Any], pidns: isolation.PidNamespaceFactory | None) -> NoReturn:
    try:
        _loop(ctl, ctx, pidns)
    finally:
        os._exit(1)


def _fork(pidns: isolation.PidNamespaceFactory | None) -> int:
    if pidns is None:
        return os.fork()
    pidns.arm()  # the next fork becomes pid 1 of a fresh pid namespace
    try:
        pid = os.fork()
    except OSError:
        pidns.disarm()
        raise
    if pid:
        pidns.disarm()
    return pid


_FD = struct.Struct("i")
_ANCILLARY = socket.CMSG_SPACE(4 * _FD.size)


def _recv(ctl: socket.socket) -> tuple[bytes, list[int]]:
    # socket.recv_fds, minus its per-call array allocations (each page touched here costs a fault)
    data, ancillary, _flags, _addr = ctl.recvmsg(64, _ANCILLARY)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [_FD.unpack_from(payload, i)[0] for i in range(0, len(payload) - len(payload) % 4, 4)]
    return data, fds


def _loop(ctl: socket.socket, ctx: dict[str, Any], pidns: isolation.PidNamespaceFactory | None) -> None:
    """Exits are noticed through each child's pidfd rather than a SIGCHLD handler: a handler (and the
    wakeup fd it needs) would have to be undone in every child, page faults and all."""
    isolation.set_parent_death_signal()  # the worker is gone: so are we (and, with namespaces, every job)
    poller = select.poll()
    ctl_fd = ctl.fileno()
    poller.register(ctl_fd, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    polling = False  # no pidfd_open (kernel < 5.3): fall back to polling wait4
    while True:
        for fd, _ev in poller.poll(10 if polling else None):
            if fd != ctl_fd:
                poller.unregister(fd)
                pid = children.pop(fd)
                os.close(fd)
                _reap(ctl, pid)
                continue
            data, fds = _recv(ctl)
            if not data:
                os._exit(0)  # the worker closed the channel
            (token,) = REQUEST.unpack(data)
            try:
                if len(fds) != 4:
                    raise OSError(0, f"expected 4 fds, got {len(fds)}")
                pid = _fork(pidns)
            except OSError as exc:
                ctl.send(MSG.pack(b"E", token, 0, exc.errno or 0, 0.0, 0))
                for f in fds:
                    os.close(f)
                continue
            if pid == 0:
                job_main(fds[0], fds[1], fds[2], fds[3], ctx)
            for f in fds:
                os.close(f)
            msg = MSG.pack(b"F", token, pid, 0, 0.0, 0)
            try:
                pidfd = os.pidfd_open(pid)
            except (AttributeError, OSError):
                polling = True
                ctl.send(msg)
                continue
            ctl.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _FD.pack(pidfd))])
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
        if polling:
            _reap(ctl, -1)


def _reap(ctl: socket.socket, which: int) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(which, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ctl.send(MSG.pack(b"X", 0, pid, status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
        if which != -1:
            return
