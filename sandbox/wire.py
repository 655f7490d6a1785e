"""Framing on the host<->worker control socket: a 4-byte length, then JSON; file descriptors ride on the
length header (SCM_RIGHTS), which is read by its own exactly-sized recvmsg so they cannot be misattributed."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")
MAX_MESSAGE = 256 * 1024 * 1024


def send(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    payload = json.dumps(obj, separators=(",", ":")).encode()
    header = _HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], fds)
        sock.sendall(payload)
    else:
        sock.sendall(header + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, max_fds: int = 4) -> tuple[Any, list[int]] | None:
    """Next message and the fds sent with it; None on EOF."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    if not data:
        for fd in fds:
            socket.close(fd)
        return None
    if len(data) < _HEADER.size:
        rest = _recv_exact(sock, _HEADER.size - len(data))
        if rest is None:
            return None
        data += rest
    (length,) = _HEADER.unpack(data)
    if length > MAX_MESSAGE:
        raise ValueError(f"control message of {length} bytes")
    payload = _recv_exact(sock, length)
    if payload is None:
        return None
    return json.loads(payload), fds
