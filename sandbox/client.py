"""A client of the sandbox HTTP service (`sandbox/server.py`): the same `run_batch` as the local pool, executed
by a remote sandbox fleet, so a GPU worker spends no CPU (and holds no SYS_ADMIN) running model-written code.

    client = RemoteSandbox("http://sandbox:8081", token=os.environ["POSTTRAIN_SANDBOX_TOKEN"])
    verdicts = client.run_batch(jobs)       # same order, same Verdicts the local pool gives

Verdicts are decided by the service (its host compares the values the tests produced); an unreachable service,
a refused token or a malformed answer raises `SandboxUnavailable` rather than scoring anything 0: a reward
computed without running the code would silently train on noise.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence

from sandbox.pool import SandboxUnavailable
from sandbox.server import MAX_JOBS_PER_REQUEST, TOKEN_ENV
from sandbox.spec import Job, Verdict


class RemoteSandbox:
    """POST /run in chunks of at most `chunk` jobs; `timeout_s` bounds one request (a whole chunk)."""

    def __init__(
        self, url: str, token: str | None, timeout_s: float = 600.0, chunk: int = MAX_JOBS_PER_REQUEST
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.chunk = max(1, min(chunk, MAX_JOBS_PER_REQUEST))

    def run_batch(self, jobs: Sequence[Job], concurrency: int | None = None) -> list[Verdict]:
        """Verdicts in input order. `concurrency` is the service's to choose; accepted for the pool's signature."""
        out: list[Verdict] = []
        for start in range(0, len(jobs), self.chunk):
            out += self._post([j.to_dict() for j in jobs[start : start + self.chunk]])
        return out

    def _post(self, body: list[dict]) -> list[Verdict]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(f"{self.url}/run", data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read()[:500].decode(errors="replace")
            hint = f" (set {TOKEN_ENV} to the service's token)" if err.code in (401, 403) else ""
            raise SandboxUnavailable(f"sandbox service {self.url}: HTTP {err.code}: {detail}{hint}") from None
        except (OSError, ValueError) as err:  # URLError, timeouts, a reset connection, a non-JSON answer
            raise SandboxUnavailable(f"sandbox service {self.url} unreachable: {err}") from None
        if not isinstance(data, list) or len(data) != len(body):
            raise SandboxUnavailable(
                f"sandbox service {self.url}: expected {len(body)} verdicts, got {type(data).__name__}"
            )
        try:
            return [Verdict.from_dict(v) for v in data]
        except (KeyError, TypeError, ValueError) as err:
            raise SandboxUnavailable(f"sandbox service {self.url}: malformed verdict ({err})") from None
