"""Helpers shared by the sandbox tests (a plain module: `conftest` names clash across test folders)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sandbox import Job, Limits, Pool, Status, TestCase

SECRET_ENV = "POSTTRAIN_SANDBOX_TEST_SECRET"
SECRET_VALUE = f"env-secret-{uuid.uuid4().hex}"
GOOD_JOB = Job(
    "def add(a, b):\n    return a + b\n", [TestCase("add(2, 3)", 5), TestCase("add(-1, 1)", 0)], Limits(wall_s=5)
)


def children(pid: int) -> list[int]:
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def pids_with_uid_in(lo: int, hi: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if lo <= os.stat(f"/proc/{name}").st_uid < hi:
                    out.append(int(name))
            except OSError:
                pass
    return out


def worker_pid(p: Pool) -> int:
    kids = children(p.worker_pid) if p.worker_pid else []
    return kids[0] if kids else p.worker_pid  # the shim's only child; the shim itself without namespaces


@dataclass
class HostGuard:
    pool: Pool
    canary: Path
    canary_text: str
    canary_stat: os.stat_result
    worker: int
    resident: frozenset[int]  # the worker's long-lived children (its fork template)

    def settled(self, timeout: float = 5.0) -> tuple[list[int], list[int], list[str]]:
        """Wait for the worker to have no job processes, no job uids alive, and an empty work dir."""
        deadline = time.monotonic() + timeout
        base = self.pool.uid_base
        while True:
            kids = [k for k in descendants(self.worker) if k not in self.resident]
            by_uid = pids_with_uid_in(base, base + self.pool.max_slots) if base is not None else []
            try:
                dirs = os.listdir(f"/proc/{self.worker}/root/tmp/sandbox-jobs")
            except OSError:
                dirs = []
            if (not kids and not by_uid and not dirs) or time.monotonic() > deadline:
                return kids, by_uid, dirs

    def check(self) -> None:
        assert self.pool.alive(), "the sandbox worker died"
        assert worker_pid(self.pool) == self.worker, "the sandbox worker was replaced (it died)"
        assert set(children(self.worker)) >= self.resident, "the fork template died"
        kids, by_uid, dirs = self.settled()
        assert not kids, f"job processes left behind: {kids}"
        assert not by_uid, f"processes still running as a sandbox uid: {by_uid}"
        assert not dirs, f"work dirs left behind: {dirs}"
        assert self.canary.read_text() == self.canary_text, "canary file modified"
        st = self.canary.stat()
        assert (st.st_mtime_ns, st.st_mode, st.st_uid) == (
            self.canary_stat.st_mtime_ns,
            self.canary_stat.st_mode,
            self.canary_stat.st_uid,
        ), "canary file touched"
        again = self.pool.run(GOOD_JOB)
        assert again.status is Status.PASSED, f"the pool no longer serves a good job: {again}"
