"""Every task of the DAGs carries the queue of its stage's kind (operators/queues.py), the names can be changed
from the environment, and the local stack reads the same names as the DAGs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local import stack
from operators.queues import ENV_NAMES, Queues

REPO = Path(__file__).resolve().parents[2]
GPU_TASKS = {"sft", "evaluate", *(f"rl_round_{n}" for n in range(1, 9))}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(REPO / "dags"))


def test_every_task_carries_its_kinds_queue(dagbag) -> None:
    queues = {dag_id: {t.task_id: t.queue for t in dag.tasks} for dag_id, dag in dagbag.dags.items()}
    post = queues["post_training"]
    assert {t for t, q in post.items() if q == "gpu"} == GPU_TASKS, post
    assert all(q == "cpu" for t, q in post.items() if t not in GPU_TASKS), post
    nightly = queues["nightly_retraining"]
    assert nightly["adopt_taskset"] == nightly["adopt_champion"] == "cpu" and nightly["rl_round_1"] == "gpu"
    assert set(queues["taskset_refresh"].values()) == {"cpu"}
    # Pools still cap concurrency, whatever the queue.
    dag = dagbag.dags["post_training"]
    assert dag.get_task("sft").pool == "gpu" and dag.get_task("rl_round_1").pool == "gpu"
    assert dag.get_task("evaluate").pool == "sandbox"


def test_queue_names_come_from_the_environment() -> None:
    renamed = Queues.from_env(
        {"POSTTRAIN_QUEUE_GPU": "a100", "POSTTRAIN_QUEUE_CPU": " ", "POSTTRAIN_QUEUE_SANDBOX": "sbx"}
    )
    assert (renamed.for_command("rl-round"), renamed.for_command("gate"), renamed.for_command("score")) == (
        "a100",
        "cpu",
        "sbx",
    )
    assert Queues.from_env({}) == Queues()
    # The DAG files read them when parsed: a dag-processor with POSTTRAIN_QUEUE_GPU set puts sft on that queue.
    code = (
        "from airflow.dag_processing.dagbag import DagBag; "
        f"d = DagBag({str(REPO / 'dags')!r}).dags['post_training']; "
        "print(d.get_task('sft').queue, d.get_task('gate').queue)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "POSTTRAIN_QUEUE_GPU": "a100", "POSTTRAIN_QUEUE_CPU": "small"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["a100", "small"]


def test_the_stack_reads_the_same_queue_names(monkeypatch) -> None:
    assert stack.QUEUE_ENV == ENV_NAMES
    assert stack.default_queues() == ("gpu", "cpu", "sandbox")
    monkeypatch.setenv("POSTTRAIN_QUEUE_GPU", "a100")
    assert stack.default_queues() == ("a100", "cpu", "sandbox") and Queues.from_env().gpu == "a100"
