"""A small HTTP front for remote reward workers (stdlib http.server, JSON in and out).

    GET  /health  -> {"ok": true, "isolation": "...", "features": {...}}
    POST /run     -> body: one job {"program", "tests": [{"call", "expected"}], "limits"?, "id"?} (or, instead of
                     "tests", "test_program": {"source", "entry_point"?, "setup"?}) -> one verdict,
                     or a list of jobs -> a list of verdicts (same order).

Every POST /run must carry `Authorization: Bearer <token>` (the service's `POSTTRAIN_SANDBOX_TOKEN`): no
header is 401, a wrong token 403, compared in constant time (`hmac.compare_digest`). GET /health answers
without it (liveness probes) and runs nothing. The server refuses to start without a token, except on a
loopback address when told so (`--insecure-loopback`, for a developer's own machine and the tests): anyone who
can reach an unauthenticated port can run code (confined, but still code) on this machine.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandbox.pool import Pool, SandboxUnavailable
from sandbox.spec import Job

MAX_BODY = 32 * 1024 * 1024
MAX_JOBS_PER_REQUEST = 4096
TOKEN_ENV = "POSTTRAIN_SANDBOX_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True
    # An AF_INET server: after bind, `server_address` is getsockname()'s (host str, port) (typeshed's union also
    # allows bytes hosts and AF_INET6 4-tuples).
    server_address: tuple[str, int]

    def __init__(self, address: tuple[str, int], pool: Pool, concurrency: int, token: str | None) -> None:
        super().__init__(address, _Handler)
        self.pool = pool
        self.concurrency = concurrency
        self.token = token.encode() if token else None


class _Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request on stderr would drown a reward worker's logs

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.rstrip("/") == "/health":
            pool = self.server.pool
            self._reply(
                200,
                {
                    "ok": pool.alive(),
                    "isolation": pool.isolation.value if pool.isolation else None,
                    "features": pool.features,
                },
            )
        else:
            self._reply(404, {"error": f"no such endpoint {self.path}; use GET /health or POST /run"})

    def _authorized(self) -> bool:
        """Replies 401/403 and returns False unless the request carries the server's token."""
        expected = self.server.token
        if expected is None:  # loopback dev server started without a token on purpose
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            self._reply(401, {"error": "missing 'Authorization: Bearer <token>'"})
            return False
        if not hmac.compare_digest(given.strip().encode(), expected):
            self._reply(403, {"error": "wrong token"})
            return False
        return True

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/run":
            self._reply(404, {"error": f"no such endpoint {self.path}; use POST /run"})
            return
        if not self._authorized():
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(411, {"error": "Content-Length required"})
            return
        if length > MAX_BODY:
            self._reply(413, {"error": f"body larger than {MAX_BODY} bytes"})
            return
        try:
            data = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            self._reply(400, {"error": f"body is not JSON: {exc}"})
            return
        single = isinstance(data, dict)
        items = [data] if single else data
        if not isinstance(items, list) or not items or len(items) > MAX_JOBS_PER_REQUEST:
            self._reply(400, {"error": f"body must be a job object or a list of 1..{MAX_JOBS_PER_REQUEST} jobs"})
            return
        try:
            jobs = [Job.from_dict(item, f"job[{i}]" if not single else "job") for i, item in enumerate(items)]
        except ValueError as exc:
            self._reply(400, {"error": str(exc)})
            return
        try:
            verdicts = self.server.pool.run_batch(jobs, self.server.concurrency)
        except SandboxUnavailable as exc:
            self._reply(503, {"error": str(exc)})
            return
        out = [v.to_dict() for v in verdicts]
        self._reply(200, out[0] if single else out)


def make_server(
    host: str, port: int, pool: Pool, concurrency: int | None = None, *, token: str | None = None
) -> SandboxServer:
    """A ready-to-serve server (port 0 picks a free port: `server.server_address`). Without a token it may
    only listen on a loopback address."""
    if not token and not is_loopback(host):
        raise ValueError(f"refusing to serve on {host} without a token: set {TOKEN_ENV}")
    pool.start()
    return SandboxServer((host, port), pool, concurrency or pool.max_slots, token or None)


def serve(
    host: str = "127.0.0.1",
    port: int = 8090,
    concurrency: int | None = None,
    *,
    allow_unisolated: bool | None = None,
    insecure_loopback: bool = False,
) -> int:
    """Serve until SIGTERM/SIGINT. The token comes from `POSTTRAIN_SANDBOX_TOKEN`; without one the server
    starts only with `insecure_loopback` on a loopback host."""
    token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and not (insecure_loopback and is_loopback(host)):
        print(
            f"error: {TOKEN_ENV} is not set; the sandbox service refuses to run code for unauthenticated "
            f"callers (only `--insecure-loopback` on 127.0.0.1 may run without a token)",
            file=sys.stderr,
        )
        return 2
    concurrency = concurrency or os.cpu_count() or 1

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # a service manager's SIGTERM: leave serve_forever, close the pool

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
    with Pool(max_slots=concurrency, allow_unisolated=allow_unisolated) as pool:
        server = make_server(host, port, pool, concurrency, token=token)
        print(
            f"sandbox serving on http://{server.server_address[0]}:{server.server_address[1]} "
            f"(isolation: {pool.isolation.value if pool.isolation else '?'}, concurrency {concurrency}, "
            f"{'token required' if token else 'NO TOKEN (loopback dev server)'})",
            file=sys.stderr,
            flush=True,
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0
