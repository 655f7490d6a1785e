"""Stage leases: two attempts of one stage (real processes) on one prefix. The retry fences the orphan, the
orphan stops before it writes again, and the retry resumes from the last checkpoint and finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training import lease, storage

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TTL_S = 3.0
STEPS = 300


def _attempt(name: str, run_uri: str, tmp_path: Path, steps: int, step_s: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "ATTEMPT": name,
        lease.TTL_ENV: str(TTL_S),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, str(HERE / "lease_stage.py"), run_uri, str(steps), str(step_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )


def _wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float, out: list[str]) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"process ended before {prefix!r}:\n" + "".join(out))
        out.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} within {timeout_s}s:\n" + "".join(out))


def _checkpoints(stage_uri: str) -> dict[int, dict]:
    return {step: storage.read_json(m, "state.json") for step, m in storage.list_complete_checkpoints(stage_uri)}


@pytest.mark.slow
def test_orphan_never_writes_after_the_retry_took_over(tmp_path: Path) -> None:
    run_uri = f"file://{tmp_path / 'run'}"
    stage_uri = storage.join(run_uri, "steps")
    orphan_out: list[str] = []
    # Both attempts count to STEPS; the orphan slowly enough that it is still running when the retry starts.
    orphan = _attempt("orphan", run_uri, tmp_path, steps=STEPS, step_s=0.2)
    retry = None
    try:
        _wait_for_line(orphan, "CHECKPOINT 3", 90, orphan_out)
        # The orphan is alive and renewing (Airflow lost track of it); its retry starts on the same prefix.
        retry_out: list[str] = []
        retry = _attempt("retry", run_uri, tmp_path, steps=STEPS, step_s=0.0)
        line = _wait_for_line(retry, "RESUMED_FROM", 60, retry_out)
        resumed_from = int(line.split()[1])
        retry_out += retry.stdout.readlines() if retry.stdout else []
        assert retry.wait(60) == 0, "".join(retry_out)
        orphan_rc = orphan.wait(30)
        orphan_out += orphan.stdout.readlines() if orphan.stdout else []
    finally:
        for proc in (orphan, retry):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    assert orphan_rc == lease.LEASE_LOST_EXIT, "".join(orphan_out)
    assert "lost the lease" in "".join(orphan_out)
    held = lease.describe(stage_uri)
    assert held is not None and held["generation"] == 2 and held["released"]
    taken_at = held["acquired_at"]
    # The retry waited for the live orphan (up to the TTL), then fenced it.
    assert "fencing attempt" in "".join(retry_out)

    ckpts = _checkpoints(stage_uri)
    assert sorted(ckpts) == list(range(1, STEPS + 1))
    orphan_steps = [s for s, c in ckpts.items() if c["attempt"] == "orphan"]
    # The orphan's writes all passed their lease check before the retry took the lease; nothing after.
    assert orphan_steps and max(orphan_steps) == resumed_from >= 3
    assert all(ckpts[s]["before_check"] < taken_at for s in orphan_steps)
    assert all(c["attempt"] == "retry" for s, c in ckpts.items() if s > resumed_from)
    # The orphan's last lines are its lease error, not another checkpoint after the takeover.
    after = [ln for ln in orphan_out if ln.startswith("CHECKPOINT")]
    assert int(after[-1].split()[1]) == resumed_from

    manifest = storage.require_manifest(stage_uri)
    assert manifest.extra["summary"] == {"resumed_from": resumed_from}
    assert json.loads(storage.read_bytes(manifest, "result.json"))["attempt"] == "retry"


@pytest.fixture(params=["file", "s3"])
def any_run_uri(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("s3_run_uri" if request.param == "s3" else "file_run_uri")


def test_acquire_release_and_takeover_of_a_dead_holder(any_run_uri: str) -> None:
    stage_uri = storage.join(any_run_uri, "stage")
    first = lease.Lease(stage_uri, ttl_s=1.5, attempt="first")
    assert first.acquire() < 0.5 and first.generation == 1
    first.check()
    # A holder that stopped renewing (killed -9): the next attempt takes over once its lease expires, not later.
    second = lease.Lease(stage_uri, ttl_s=1.5, attempt="second")
    started = time.monotonic()
    second.acquire()
    assert second.generation == 2 and time.monotonic() - started < 3.0
    with pytest.raises(lease.LeaseLost, match="lost the lease"):
        first.check()
    # The fenced attempt's writes under the stage prefix are refused before they reach storage.
    unguard = storage.guard_writes(stage_uri, first.check)
    try:
        with pytest.raises(lease.LeaseLost):
            storage.ManifestWriter(storage.join(stage_uri, "checkpoints", "step-00000001")).put_bytes(b"x", "f")
    finally:
        unguard()
    assert not list(storage.iter_files(storage.join(stage_uri, "checkpoints")))
    second.release()
    third = lease.Lease(stage_uri, ttl_s=1.5, attempt="third")
    started = time.monotonic()
    third.acquire()  # released: no wait
    assert third.generation == 3 and time.monotonic() - started < 0.5


@pytest.mark.parametrize("where", ["file", "aws"])
def test_a_generation_is_taken_once(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # file:// links exclusively; an S3 that honours If-None-Match (AWS, MinIO; here moto) refuses the second PUT.
    uri = f"file://{tmp_path}" if where == "file" else request.getfixturevalue("aws_s3_run_uri")
    loc = storage.locate(uri)
    key = loc.key("_lease/gen-00000001.json")
    assert lease._create_exclusive(loc, key, b"a")
    assert not lease._create_exclusive(loc, key, b"b")
    assert loc.backend.get_bytes(key) == b"a"


def test_reads_during_renewals_never_fail_the_holder(any_run_uri: str) -> None:
    """The holder's renewal rewrites its generation object in place while the stage checks it before each write,
    and a waiting retry polls it. s3rver (the embedded stack's S3) truncates an object before writing it, so a
    read can land between the two; neither reader may take that for a lost lease or crash on it."""
    stage_uri = storage.join(any_run_uri, "stage")
    holder = lease.Lease(stage_uri, ttl_s=0.15, attempt="holder")  # renews every 50 ms: many overlaps
    holder.acquire()
    holder.start()
    other = lease.Lease(stage_uri, ttl_s=600, attempt="other")  # a retry's view of the lease
    try:
        for _ in range(40):  # dozens of renewals overlap these reads
            holder.check()
            record = other.current()
            assert record is not None and record.attempt == "holder" and record.generation == 1
        assert not holder.lost
    finally:
        holder.release()


def test_a_released_lease_says_how_its_attempt_ended(file_run_uri: str) -> None:
    stage_uri = storage.join(file_run_uri, "stage")
    with pytest.raises(ValueError), lease.hold(stage_uri, ttl_s=5):
        raise ValueError("row 3: field 'prompt' is empty")
    with lease.hold(stage_uri, ttl_s=5):
        pass
    first, second = lease.history(stage_uri)
    assert (first["generation"], first["released"]) == (1, True)
    assert first["outcome"] == "failed: ValueError: row 3: field 'prompt' is empty"
    assert (second["generation"], second["outcome"]) == (2, "complete")
