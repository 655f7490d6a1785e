"""A machine crash mid-round on the real embedded stack: the scheduler (with its executor workers and the task
supervisors under it) and the rl_round stage process are killed -9 while the round trains. A new scheduler is
started, and nobody touches the run after that: it must finish on its own, the retried round must resume from
its last checkpoint, and the test prints the seconds from the crash to resumed training.

The stack is started for the module exactly as `make up` starts it (S3, MLflow, Airflow API server, scheduler
and DAG processor; LocalExecutor), with the production retry delay, on free ports in a temporary folder.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from infra.local.demo import Airflow, wait_for_dag
from infra.local.stack import Stack
from tests.stack_runs import running_stack, short_run
from training import lease, storage

pytestmark = pytest.mark.slow
DAG = "post_training"
# The browser tests' tiny run, with one round long enough that a checkpoint exists well before its end.
# Small steps (2 prompts x 4 samples, one draw each) keep the round short; the crash lands after the first
# checkpoint, with 4 of 6 steps still to go.
OVERRIDES = short_run(
    sft={"max_steps": 4},
    rl_round={
        "steps": 6,
        "checkpoint_every": 2,
        "prompts_per_step": 2,
        "samples_per_prompt": 4,
        "dynamic_sampling": False,
        "holdout_per_domain": 3,
    },
)
RUN_TIMEOUT_S = 1200  # a guard for a shared machine, not the expected time
RESUMED = re.compile(r"resumed from checkpoint step (\d+)")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    # The production retry delay and lease TTL (tests/conftest.py shortens them for the other tests): the figure
    # printed below is what a real crash costs. The DAG files do not change: parse them once, not every 30 s.
    env = {
        "POSTTRAIN_RETRY_DELAY_S": None,
        "POSTTRAIN_LEASE_TTL_S": None,
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    with running_stack(tmp_path_factory.mktemp("crash-stack"), env=env) as st:
        yield st


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    out, todo = [pid], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _stage_pid(run_uri: str) -> int | None:
    """The rl-round stage process of this run, found in the process table (it runs in its own session)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        try:
            leader = os.getpgid(int(entry)) == int(entry)
        except ProcessLookupError:
            continue
        if "rl-round" in args and run_uri in args and leader:
            return int(entry)
    return None


def _kill9(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _attempt_logs(stack: Stack, run_id: str) -> dict[int, str]:
    base = stack.airflow_home / "logs" / f"dag_id={DAG}" / f"run_id={run_id}" / "task_id=rl_round_1"
    out = {}
    for path in base.glob("attempt=*.log"):
        try:
            out[int(path.stem.split("=")[1])] = path.read_text(errors="replace")
        except (OSError, ValueError):
            pass
    return out


def test_crashed_round_resumes_and_the_run_finishes_on_its_own(stack: Stack) -> None:
    api = Airflow(stack.airflow_url, stack.airflow_password() or "")
    api.login()
    wait_for_dag(api)
    api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
    run_root = f"s3://posttrain/crash/{uuid.uuid4().hex[:8]}"
    run = api.call(
        "POST",
        f"/api/v2/dags/{DAG}/dagRuns",
        {"logical_date": None, "conf": {"run_root": run_root, "rounds": 1, "stage_overrides": OVERRIDES}},
    )
    run_id = run["dag_run_id"]
    started = time.monotonic()

    # Wait until round 1 has a complete mid-round checkpoint and its stage process is alive.
    stage_pid = run_uri = None
    while True:
        assert time.monotonic() - started < RUN_TIMEOUT_S, "round 1 never reached a checkpoint"
        state = api.call("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}")["state"]
        assert state in ("queued", "running"), f"the run ended ({state}) before the crash"
        runs = {k.split("/", 1)[0] for k in storage.iter_files(run_root)}
        if runs:
            run_uri = storage.join(run_root, runs.pop())
            found = storage.last_complete_checkpoint(storage.join(run_uri, "rl_round_1"))
            stage_pid = _stage_pid(run_uri)
            if found and stage_pid:
                break
        time.sleep(0.5)

    # The crash: the scheduler with everything under it (executor workers, task supervisors and runners), and
    # the stage's whole process group. The API server and the metadata DB live on, as on a separate host.
    scheduler = stack.running_pid("airflow-scheduler")
    assert scheduler is not None
    victims = _tree(scheduler)
    _kill9(victims)
    os.killpg(stage_pid, signal.SIGKILL)
    crashed = time.monotonic()
    stage_uri = storage.join(run_uri, "rl_round_1")
    found = storage.last_complete_checkpoint(stage_uri)
    assert found is not None
    last_step = found[0]
    assert storage.read_manifest(stage_uri) is None, "the round finished before the crash: nothing to resume"
    print(
        f"\ncrash at {crashed - started:.0f}s into the run: killed -9 scheduler tree {victims} and stage "
        f"{stage_pid}; last complete checkpoint: step {last_step}"
    )

    # A machine coming back: its scheduler starts again. Nothing else is done to the run.
    argv = dict(stack._service("airflow").companions)["airflow-scheduler"]
    stack._launch("airflow-scheduler", argv, stack.airflow_env())

    resumed_at = None
    resumed_step = None
    while True:
        now = time.monotonic()
        assert now - crashed < RUN_TIMEOUT_S, "the run did not finish after the crash"
        if resumed_at is None:
            for attempt, text in sorted(_attempt_logs(stack, run_id).items()):
                m = RESUMED.search(text)
                if attempt > 1 and m:
                    resumed_at, resumed_step = now, int(m.group(1))
                    print(
                        f"round 1 resumed from step {resumed_step} (attempt {attempt}) "
                        f"{resumed_at - crashed:.1f}s after the crash"
                    )
        state = api.call("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            break
        time.sleep(1)
    finished = time.monotonic()
    tis = {
        t["task_id"]: t for t in api.call("GET", f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances")["task_instances"]
    }
    print(
        f"run {state} {finished - crashed:.0f}s after the crash ({finished - started:.0f}s in all); "
        f"rl_round_1 tries: {tis['rl_round_1']['try_number']}"
    )

    assert state == "success", {k: t["state"] for k, t in tis.items()}
    assert resumed_step == last_step, f"resumed from {resumed_step}, last checkpoint before the crash {last_step}"
    assert resumed_at is not None
    summary = storage.require_manifest(stage_uri).extra["summary"]
    assert summary["resumed_from"] == last_step
    # The retry took the round's lease from the killed attempt (generation 2 or later) and released it.
    held = lease.describe(stage_uri)
    assert held is not None and held["generation"] >= 2 and held["released"]
