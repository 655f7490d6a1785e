"""The tiny `post_training` DAG with SFT and the RL round each run by torchrun in 2 processes (gloo on CPU),
through the real local launcher: `POSTTRAIN_NPROC_PER_NODE=2` (operators/pipeline.NPROC_PER_NODE) makes the
sft and rl-round StageSpecs `nproc_per_node=2`. Settings are cut to a few steps; the product's quality bar is
tests/e2e/test_post_training_dag.py's, on one process.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from training import storage

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_tiny_dag_runs_sft_and_rl_under_torchrun_with_two_processes(airflow_db, local_stack, monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from operators import pipeline

    monkeypatch.setattr(pipeline, "NPROC_PER_NODE", 2)
    dag = DagBag(str(REPO / "dags")).dags["post_training"]
    assert dag.get_task("sft").spec.nproc_per_node == 2 and dag.get_task("rl_round_1").spec.nproc_per_node == 2
    assert dag.get_task("evaluate").spec.nproc_per_node == 1
    name = f"dist-{uuid.uuid4().hex[:6]}"
    run_root = f"s3://posttrain/e2e-dist/{uuid.uuid4().hex[:8]}"
    dr = dag.test(
        run_conf={
            "run_root": run_root,
            "rounds": 1,
            "stage_overrides": {
                "taskset": {"counts": {"math": 300, "code": 40, "extraction": 40, "instruction": 40}},
                "sft": {"max_steps": 12, "checkpoint_every": 6, "log_every": 6},
                "rl_round": {"steps": 2, "prompts_per_step": 8, "checkpoint_every": 1, "holdout_per_domain": 4},
                # evaluate runs on one process; a small evaluation without the long-context sweep keeps it short
                "evaluate": {
                    "model_name": name,
                    "max_tasks_per_domain": 4,
                    "n_samples": 1,
                    "ks": [1],
                    "long_context_tasks": 0,
                },
                "promote": {"model_name": name},
            },
        }
    )
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    runs = {key.split("/", 1)[0] for key in storage.iter_files(run_root)}
    run_uri = storage.join(run_root, runs.pop())
    for stage_name in ("sft", "rl_round_1"):
        summary = storage.require_manifest(storage.join(run_uri, stage_name)).extra["summary"]
        assert summary["world_size"] == 2, stage_name
    ckpt = storage.require_manifest(storage.checkpoint_uri(storage.join(run_uri, "sft"), 6))
    assert "dcp/.metadata" in ckpt.files and ckpt.extra["world_size"] == 2
