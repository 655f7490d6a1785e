"""Fixtures for the sandbox tests: one worker pool per session, and a guard that proves the host is
unharmed after a job (worker alive and serving, no leftover processes or work dirs, canary untouched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import SECRET_ENV, SECRET_VALUE, HostGuard, children, worker_pid

from sandbox import Pool, SandboxUnavailable


@pytest.fixture(scope="session")
def pool():
    # set before the worker starts: the worker gets a scrubbed environment, so jobs must never see it
    os.environ[SECRET_ENV] = SECRET_VALUE
    p = Pool(max_slots=8, tmp_size_mb=64)
    try:
        p.start()
    except SandboxUnavailable as exc:
        os.environ.pop(SECRET_ENV, None)
        pytest.skip(f"the sandbox cannot isolate jobs on this machine: {exc}")
    yield p
    p.close()
    os.environ.pop(SECRET_ENV, None)


@pytest.fixture
def host_guard(pool: Pool, tmp_path: Path):
    canary = tmp_path / "canary.txt"
    canary.write_text("do not touch")
    canary.chmod(0o644)
    worker = worker_pid(pool)
    guard = HostGuard(pool, canary, canary.read_text(), canary.stat(), worker, frozenset(children(worker)))
    yield guard
    guard.check()
