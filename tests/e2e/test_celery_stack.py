"""Airflow scaled out: the embedded stack in CeleryExecutor mode (a real PostgreSQL, a real Redis broker) with two
workers on different queues, `post_training` triggered through the REST API on the tiny profile, and every stage
found on the worker of its queue (operators/queues.py): training and evaluation on the gpu worker, the rest on
the cpu worker. A stage sent to the wrong queue, or a worker that took another queue's task, fails it.

The workload is cut to the bone (a small task set, 8 SFT steps, one RL round of one step, 8 evaluation tasks a
domain) because what is under test is where tasks run, not what they learn; the gate's tolerance is opened so the
run reaches `promote`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from infra.local.stack import AIRFLOW_USER, StackError, worker_name
from tests.stack_runs import SHORT_RUN, running_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))  # the REST helpers the UI tests use
from browser_helpers import airflow_token, api, wait_for_dag  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG = "post_training"
OVERRIDES = SHORT_RUN
GPU_TASKS = {"sft", "rl_round_1", "evaluate"}
CPU_TASKS = {"build_taskset", "gate", "approval", "gate_verdict", "promote", "end_tracking"}
# A guard, not the expected time: a shared 2-core machine under load took 576 s where a quiet one takes a fraction.
RUN_TIMEOUT_S = 1200


def _need_servers() -> None:
    """The test needs PostgreSQL and Redis installed (.ci/run installs both); nothing else is a reason to skip."""
    from infra.local.stack import _pg_bin, _redis_server

    try:
        _pg_bin("postgres")
        _redis_server()
    except StackError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def celery_stack():
    _need_servers()
    # Not under pytest's temporary folder: that is private (0700), and PostgreSQL runs as the `postgres` user
    # when the tests run as root, so it must be able to enter the state folder (/tmp is world-enterable).
    state = Path(tempfile.mkdtemp(prefix="posttrain-celery-stack-", dir="/tmp" if os.geteuid() == 0 else None))
    state.chmod(0o711)
    started = time.monotonic()
    try:
        # The DAG files do not change during the test: parse them once, not every 30 s.
        with running_stack(
            state,
            env={"AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600"},
            ports=("s3", "mlflow", "airflow", "postgres", "redis"),
            executor="celery",
            queues=("cpu", "gpu"),
        ) as stack:
            token = airflow_token(stack.airflow_url, AIRFLOW_USER, stack.airflow_password() or "")
            wait_for_dag(stack.airflow_url, token, DAG)
            print(f"celery stack up and {DAG} parsed in {time.monotonic() - started:.0f}s")
            yield stack, token
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_stack_runs_celery_with_one_worker_per_queue(celery_stack) -> None:
    stack, token = celery_stack
    status = stack.status()
    assert {"postgres", "redis", "celery-worker-cpu", "celery-worker-gpu"} <= set(status), status
    assert all(s["healthy"] and s["pid"] for s in status.values()), status
    health = api(stack.airflow_url, token, "monitor/health")
    assert health["metadatabase"]["status"] == "healthy", health
    # Queues say where a task runs; the pools still cap how many GPU and sandbox stages run at once.
    pools = {p["name"]: p["slots"] for p in api(stack.airflow_url, token, "pools")["pools"]}
    assert pools["gpu"] == 1 and pools["sandbox"] == 1, pools
    config_env = stack.airflow_env()
    assert config_env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert config_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")


def test_post_training_stages_run_on_the_worker_of_their_queue(celery_stack) -> None:
    stack, token = celery_stack
    started = time.monotonic()
    api(stack.airflow_url, token, f"dags/{DAG}", "PATCH", {"is_paused": False})
    run = api(
        stack.airflow_url,
        token,
        f"dags/{DAG}/dagRuns",
        "POST",
        {"logical_date": None, "conf": {"rounds": 1, "stage_overrides": OVERRIDES}},
    )
    run_id = quote(run["dag_run_id"])
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := api(stack.airflow_url, token, f"dags/{DAG}/dagRuns/{run_id}")["state"]) not in (
        "success",
        "failed",
    ):
        assert time.monotonic() < deadline, f"run {run_id} still {state} after {RUN_TIMEOUT_S}s"
        time.sleep(3)
    tis = {
        ti["task_id"]: ti
        for ti in api(stack.airflow_url, token, f"dags/{DAG}/dagRuns/{run_id}/taskInstances?limit=100")[
            "task_instances"
        ]
    }
    where = {task: (ti["state"], ti["queue"], ti["hostname"]) for task, ti in tis.items()}
    print(f"run {run_id} ended {state} after {time.monotonic() - started:.0f}s: {where}")
    assert state == "success", where
    assert tis["promote"]["state"] == "success" and tis["blocked"]["state"] == "skipped", where

    for task in GPU_TASKS:
        assert (tis[task]["state"], tis[task]["queue"], tis[task]["hostname"]) == (
            "success",
            "gpu",
            worker_name("gpu"),
        ), (task, where)
        assert tis[task]["pool"] in ("gpu", "sandbox"), (task, tis[task]["pool"])
    for task in CPU_TASKS:
        assert (tis[task]["state"], tis[task]["queue"], tis[task]["hostname"]) == (
            "success",
            "cpu",
            worker_name("cpu"),
        ), (task, where)
    # Every task a worker ran (the rounds beyond `rounds` too: they run, then skip) ran on its queue's worker.
    ran = {task: ti for task, ti in tis.items() if ti["hostname"]}
    assert set(ran) >= GPU_TASKS | CPU_TASKS
    for task, ti in ran.items():
        assert ti["hostname"] == worker_name(ti["queue"]), (task, where)
