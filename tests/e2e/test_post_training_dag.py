"""The whole product on the tiny profile: the `post_training` DAG under dag.test() against the real local
stack (S3-compatible server + MLflow server), a stage killed mid-round and retried by Airflow, then the gate
facing a planted degraded checkpoint and a planted reward hack.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from training import storage

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = f"e2e-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pipeline_run(airflow_db, local_stack):
    """One post_training run: rl_round_1 is SIGKILLed right after its step-15 checkpoint, Airflow retries it."""
    from airflow.dag_processing.dagbag import DagBag

    os.environ["POSTTRAIN_KILL_AFTER_CHECKPOINT"] = "rl_round_1:15"  # a real crash at a precise point
    try:
        dag = DagBag(str(REPO / "dags")).dags["post_training"]
        run_root = f"s3://posttrain/e2e/{uuid.uuid4().hex[:8]}"
        dr = dag.test(
            run_conf={
                "run_root": run_root,
                "rounds": 2,
                "stage_overrides": {
                    # The tiny profile with a shorter SFT, shorter rounds and a smaller evaluation: this test
                    # checks the product's path (stages, retry, resume, tracking, gate, promotion); how much RL
                    # lifts the tiny model is tests/training/stages/test_tiny_pipeline.py's job. 250 SFT steps
                    # (the profile's 450 cost ~2x the time) still leave a champion good enough that the damaged
                    # planted one regresses credibly.
                    "sft": {"max_steps": 250},
                    "rl_round": {"steps": 30, "checkpoint_every": 15},
                    "evaluate": {
                        "model_name": MODEL_NAME,
                        "max_tasks_per_domain": 60,
                        "n_samples": 4,
                        "ks": [1, 4],
                        "long_context_tasks": 10,
                    },
                    "promote": {"model_name": MODEL_NAME},
                },
            }
        )
    finally:
        del os.environ["POSTTRAIN_KILL_AFTER_CHECKPOINT"]
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    return dr, tis, run_root


def _run_uri(run_root: str) -> str:
    runs = {key.split("/", 1)[0] for key in storage.iter_files(run_root)}
    assert len(runs) == 1, runs
    return storage.join(run_root, runs.pop())


def test_dag_runs_end_to_end_and_promotes(pipeline_run) -> None:
    from training import registry

    dr, tis, run_root = pipeline_run
    states = {k: ti.state for k, ti in tis.items()}
    assert dr.state == "success", states
    assert states["rl_round_3"] == "skipped" and states["rl_round_4"] == "skipped"
    assert states["promote"] == "success" and states["blocked"] == "skipped", states
    run_uri = _run_uri(run_root)
    for stage in ("taskset", "sft", "rl_round_1", "rl_round_2", "evaluate", "gate", "promote"):
        assert storage.read_manifest(storage.join(run_uri, stage)) is not None, stage
    verdict = storage.read_json(storage.require_manifest(storage.join(run_uri, "gate")), "verdict.json")
    assert verdict["decision"] == "promote", verdict
    champ = registry.champion(MODEL_NAME)
    assert champ is not None and champ.source == storage.join(run_uri, "rl_round_2")
    report = storage.require_manifest(storage.join(run_uri, "evaluate"))
    html = storage.read_bytes(report, "report.html").decode()
    # pass@1 per domain, pass@1 along the long-context sweep, reward per round
    plots = {"plots/pass1_by_domain.png", "plots/long_context_sweep.png", "plots/reward_per_round.png"}
    assert html.count('src="data:image/png;base64,') == len(plots)
    assert plots <= set(report.files)


def test_mlflow_shows_what_a_reviewer_expects(pipeline_run) -> None:
    """The parent run ended with the DAG run; splits are datasets of the stages that read them; every stage
    that wrote a model has a LoggedModel linked to its run, and the champion version names run and model;
    training stages carry system metrics; the experiment is a model-training one."""
    from mlflow import MlflowClient

    from training import registry, tracking

    dr, tis, run_root = pipeline_run
    assert tis["end_tracking"].state == "success"
    slug = _run_uri(run_root).rsplit("/", 1)[-1]
    client = MlflowClient()
    exp = client.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{tracking.RUN_TAG}` = '{slug}'")
    by_stage = {r.data.tags[tracking.STAGE_TAG]: r for r in runs}
    assert by_stage["pipeline"].info.status == "FINISHED"
    assert by_stage["pipeline"].data.tags["posttrain.outcome"] == "promoted"
    datasets = {
        stage: {(d.dataset.name, d.tags[0].value) for d in r.inputs.dataset_inputs} for stage, r in by_stage.items()
    }
    assert datasets["sft"] == {("taskset-train", "training")}
    assert datasets["rl_round_1"] == {("taskset-train", "training"), ("taskset-holdout", "evaluation")}
    assert datasets["evaluate"] == {("taskset-holdout", "evaluation")}
    holdout = next(d.dataset for d in by_stage["evaluate"].inputs.dataset_inputs)
    manifest = storage.require_manifest(storage.join(_run_uri(run_root), "taskset"))
    assert manifest.files["holdout.parquet"].sha256.startswith(holdout.digest) and "holdout.parquet" in holdout.source
    for stage in ("sft", "rl_round_1", "rl_round_2"):
        outputs = by_stage[stage].outputs.model_outputs
        assert len(outputs) == 1, stage
        model = client.get_logged_model(outputs[0].model_id)
        assert model.source_run_id == by_stage[stage].info.run_id
        assert model.tags["posttrain.checkpoint_uri"] == storage.join(_run_uri(run_root), stage)
        assert any(k.startswith("system/cpu_utilization") for k in by_stage[stage].data.metrics), stage
    champ = registry.champion(MODEL_NAME)
    version = client.get_model_version(MODEL_NAME, champ.version)
    assert version.run_id == by_stage["rl_round_2"].info.run_id
    assert version.tags["posttrain.logged_model_id"] == by_stage["rl_round_2"].outputs.model_outputs[0].model_id


def test_killed_stage_was_retried_by_airflow_and_resumed(pipeline_run) -> None:
    dr, tis, run_root = pipeline_run
    from training import lease

    run_uri = _run_uri(run_root)
    assert tis["rl_round_1"].try_number == 2, "the first attempt was killed; Airflow's retry finished the round"
    killed, retry = lease.history(storage.join(run_uri, "rl_round_1"))
    assert (killed["released"], retry["outcome"]) == (False, "complete"), (killed, retry)  # kill -9 releases nothing
    # Nothing else was retried; if something was, its earlier attempt's lease record says why it ended.
    retried = {
        task: lease.history(storage.join(run_uri, task))
        for task, ti in tis.items()
        if ti.try_number > 1 and task != "rl_round_1"
    }
    assert not retried, retried
    summary = storage.require_manifest(storage.join(run_uri, "rl_round_1")).extra["summary"]
    assert summary["resumed_from"] == 15


def _plant_round(run_uri: str, stage_name: str, model, tok, train_reward: float) -> str:
    from training.modeling import models

    writer = storage.ManifestWriter(storage.join(run_uri, stage_name))
    models.save_checkpoint(model, tok, writer, "model")
    writer.commit(extra={"summary": {"train_reward_mean": train_reward}})
    return writer.uri


def test_gate_blocks_planted_degraded_checkpoint_and_reward_hack(pipeline_run, tmp_path) -> None:
    """A second run on the same task set and SFT model whose RL "rounds" are the champion with its weights
    damaged, while the train reward they report rises: evaluate compares with the champion, the gate blocks
    naming the domains, and promote refuses."""
    import torch

    from training import cli, registry
    from training.modeling import models

    _, _, run_root = pipeline_run
    first = _run_uri(run_root)
    champ_before = registry.champion(MODEL_NAME)
    run2 = f"{run_root}-planted"
    assert cli.main(["adopt", "--source", storage.join(first, "taskset"), "--as", "taskset", "--run", run2]) == 0
    assert (
        cli.main(["adopt", "--source", storage.join(first, "sft"), "--as", "sft", "--prefix", "model", "--run", run2])
        == 0
    )
    model, tok = models.load_model(champ_before.source, "model", cache_dir=tmp_path / "champ")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * 0.6)  # damage every weight: the degraded checkpoint
    _plant_round(run2, "rl_round_1", model, tok, train_reward=0.30)
    _plant_round(run2, "rl_round_2", model, tok, train_reward=0.85)

    overrides = [
        "--set",
        f"model_name={MODEL_NAME}",
        "--set",
        "max_tasks_per_domain=100",
        "--set",
        "n_samples=4",
        "--set",
        "ks=[1,4]",
    ]
    assert cli.main(["evaluate", "--run", run2, *overrides]) == 0
    assert cli.main(["gate", "--run", run2]) == 0
    verdict = storage.read_json(storage.require_manifest(storage.join(run2, "gate")), "verdict.json")
    assert verdict["decision"] == "block"
    rules = {(f["rule"], f["reference"]) for f in verdict["findings"]}
    assert ("regression", "champion") in rules and ("reward_hacking", "rl_rounds") in rules, verdict["reasons"]
    blocked = {f["domain"] for f in verdict["findings"] if f["rule"] == "regression"}
    # The damaged weights regress the domains the champion was good at (which ones depends on the profile; on
    # the tiny one code and extraction drop furthest), and every reason names a domain or the RL rounds.
    domains = {"math", "code", "extraction", "instruction"}
    assert blocked & domains and all(r.split(":")[0] in blocked | domains for r in verdict["reasons"])
    assert cli.main(["promote", "--run", run2, "--set", f"model_name={MODEL_NAME}"]) == 2
    assert registry.champion(MODEL_NAME) == champ_before  # the alias did not move
