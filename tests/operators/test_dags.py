"""DAG files import cleanly; the trigger form maps to stage configs; a real stage runs through Airflow."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from operators.pipeline import MAX_ROUNDS, model_name, run_slug, stage_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(REPO / "dags"))


def test_dagbag_imports_without_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == {"post_training", "nightly_retraining", "taskset_refresh"}
    dag = dagbag.dags["post_training"]
    ids = [t.task_id for t in dag.tasks]
    assert ids[:2] == ["build_taskset", "sft"]
    assert [f"rl_round_{n}" for n in range(1, MAX_ROUNDS + 1)] == [i for i in ids if i.startswith("rl_round")]
    assert dag.get_task("evaluate").trigger_rule == "none_failed"
    assert set(dag.get_task("gate_verdict").downstream_task_ids) == {"promote", "blocked"}
    assert dag.get_task("gate_verdict").upstream_task_ids == {"approval"}
    assert dag.get_task("approval").upstream_task_ids == {"gate"}
    end = dag.get_task("end_tracking")
    assert end.is_teardown and end.upstream_task_ids == {"promote", "blocked"}
    assert {"base_model", "profile", "mix", "rounds", "k", "learning_rate", "kl_coef"} <= set(dag.params)
    for task in dag.tasks:
        if hasattr(task, "spec"):
            assert task.retries == 2
            assert {"run_uri", "config"} <= set(task.template_fields)


def test_a_runs_conf_does_not_become_another_dags_default() -> None:
    """Airflow resolves a run's conf in place into the DAG's own Param objects for a task that filters the DAG's
    params out of its own (the HITL approval does): a DAG sharing those objects with another DAG, or with the
    next parse of the folder, would hand this run's recipe and overrides to the next run as its defaults (found
    when a distributed run's overrides turned up in a nightly run of another test)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.param import process_params

    from operators.form import PARAMS

    first, second = DagBag(str(REPO / "dags")).dags, DagBag(str(REPO / "dags")).dags
    post = first["post_training"]
    conf = {"recipe": "/recipes/mine.yaml", "rounds": 1, "stage_overrides": {"evaluate": {"model_name": "x"}}}
    process_params(post, post.get_task("approval"), conf, suppress_exception=False)  # what the task run does
    assert post.params["rounds"] == 1, "Airflow no longer resolves into the DAG's Params: this guard can go"
    others = [dag for dag in [*first.values(), *second.values()] if dag is not post]
    for dag in others:
        for name in set(conf) & set(dag.params):
            assert dag.params[name] == PARAMS[name].value, (dag.dag_id, name)
    assert PARAMS["rounds"].value == 2 and {d.dag_id for d in others} >= {"post_training", "nightly_retraining"}


def test_nightly_and_refresh_wiring(dagbag) -> None:
    from operators.pipeline import TASKSET_ASSET

    nightly = dagbag.dags["nightly_retraining"]
    assert "0 2 * * *" in nightly.timetable.summary and "Asset" in nightly.timetable.summary
    assert set(nightly.get_task("rl_round_1").upstream_task_ids) == {"adopt_taskset", "adopt_champion"}
    champion = nightly.get_task("adopt_champion")
    assert champion.spec.args[-1] == "--source"
    assert jinja2.Template(champion.stage_args[0]).render(model_name=model_name, params={}) == (
        "models:/posttrain-tiny@champion"  # POSTTRAIN_MODEL_NAME without a recipe; a recipe's own with one
    )
    refresh = dagbag.dags["taskset_refresh"]
    assert [o.uri for o in refresh.get_task("publish").outlets] == [TASKSET_ASSET.uri]
    # feedback is imported before the build, and a skipped import (no feedback configured) still builds
    assert refresh.get_task("build_taskset").upstream_task_ids == {"import_feedback"}
    assert refresh.get_task("build_taskset").trigger_rule == "none_failed"
    assert refresh.get_task("import_feedback").spec.argv("", None)[:3] == ["posttrain", "feedback", "import"]


def test_the_loops_schedules_are_the_deployments() -> None:
    from airflow.sdk import Asset
    from airflow.timetables.assets import AssetOrTimeSchedule

    from operators.pipeline import TASKSET_ASSET, nightly_schedule, refresh_schedule

    clocked = nightly_schedule("30 3 * * 1-5")
    assert isinstance(clocked, AssetOrTimeSchedule) and "30 3 * * 1-5" in clocked.summary
    assert nightly_schedule("off") is TASKSET_ASSET and isinstance(nightly_schedule(""), Asset)
    assert refresh_schedule("@daily") == "@daily" and refresh_schedule("off") is None


def test_stage_configs_from_params() -> None:
    from training.profiles import TINY

    params = {
        "seed": 3,
        "k": 4,
        "learning_rate": 1e-3,
        "kl_coef": 0.05,
        "mix": {"math": 1.0},
        "base_model": "",
        "profile": "tiny",
        "advantage": "rloo",
        "policy_loss": "cispo",
    }
    # The tiny preset first, the form's knobs on top.
    assert json.loads(stage_config("rl_round_2", params)) == {
        **TINY["rl_round"],
        "seed": 3,
        "samples_per_prompt": 4,
        "lr": 1e-3,
        "beta": 0.05,
        "domain_weights": {"math": 1.0},
        "advantage": "rloo",
        "policy_loss": "cispo",
    }
    assert json.loads(stage_config("taskset", params)) == {
        **TINY["taskset"],
        "profile": "tiny",
        "seed": 3,
        "mix": {"math": 1.0},
    }
    # A base model of the user's gets the pretrained-model preset of its size, not the tiny one; knobs on top.
    from training.profiles import PRETRAINED_TIERS

    assert json.loads(stage_config("sft", {**params, "base_model": "s3://m/x"})) == {
        **PRETRAINED_TIERS["1.5B"]["sft"],
        "seed": 3,
        "base_model": "s3://m/x",
    }
    qwen7 = {**params, "base_model": "Qwen/Qwen2.5-7B-Instruct"}
    assert json.loads(stage_config("rl_round_1", qwen7)) == {
        **PRETRAINED_TIERS["8B"]["rl_round"],
        "seed": 3,
        "samples_per_prompt": 4,
        "lr": 1e-3,
        "beta": 0.05,
        "domain_weights": {"math": 1.0},
        "advantage": "rloo",
        "policy_loss": "cispo",
    }
    assert json.loads(stage_config("rl_round_1", qwen7))["lora"]["enabled"] is True
    # Knobs left empty in the form keep the preset (or the stage defaults).
    assert json.loads(stage_config("rl_round_1", {"seed": 0, "k": None, "learning_rate": None})) == {
        **TINY["rl_round"],
        "seed": 0,
    }
    assert json.loads(stage_config("sft", {"base_model": "", "profile": "data"})) == {"seed": 0}
    assert json.loads(stage_config("gate", params)) == {}
    gate = {
        **params,
        "gate_metrics": ["pass1", "long_context"],
        "noninferiority_margin": 0.03,
        "max_kl": 0.5,
        "min_entropy_ratio": None,
    }
    assert json.loads(stage_config("gate", gate)) == {
        "metrics": ["pass1", "long_context"],
        "noninferiority_margin": 0.03,
        "max_kl": 0.5,
    }
    from training.config import from_dict
    from training.evaluation.gate_rules import GateConfig

    assert from_dict(GateConfig, json.loads(stage_config("gate", gate))).margin_for("math") == 0.03
    overrides = {"rl_round": {"steps": 5}, "rl_round_2": {"steps": 7}, "gate": {"tolerance": 0.05}}
    assert json.loads(stage_config("rl_round_1", {"stage_overrides": overrides}))["steps"] == 5
    assert json.loads(stage_config("rl_round_1", {"stage_overrides": overrides}))["lr"] == TINY["rl_round"]["lr"]
    assert json.loads(stage_config("rl_round_2", {"stage_overrides": overrides}))["steps"] == 7
    assert json.loads(stage_config("gate", {"stage_overrides": overrides})) == {"tolerance": 0.05}
    assert run_slug("manual__2026-12-03T08:00:00+00:00") == "manual__2026-12-03T08-00-00-00-00"


def _plant_report(run_uri: str, candidate_rates: dict, sft_rates: dict) -> None:
    from training import storage

    def model(rates):
        return {
            "uri": "",
            "domains": {d: {"pass1": {"passed": round(r * 100), "total": 100}} for d, r in rates.items()},
        }

    cand = storage.ManifestWriter(storage.join(run_uri, "rl_round_1"))
    cand.put_bytes(b"w", "model/model.safetensors")
    cand.commit()
    report = {
        "models": {"candidate": {**model(candidate_rates), "uri": cand.uri}, "sft": model(sft_rates)},
        "candidate_stage": "rl_round_1",
    }
    ev = storage.ManifestWriter(storage.join(run_uri, "evaluate"))
    ev.put_json(report, "report.json")
    ev.commit()


def _test_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(REPO / "tests" / "dags"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def _links(ti) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id).all()
        return {
            r.key: r.value if isinstance(r.value, dict) else json.loads(r.value)
            for r in rows
            if r.key.startswith("posttrain_")
        }


@pytest.mark.slow
@pytest.mark.parametrize("improves", [True, False])
def test_gate_and_promote_through_airflow(airflow_db, tmp_path, monkeypatch, improves) -> None:
    """The real operator launches the real `posttrain gate` / `promote` processes under dag.test()."""
    from training import registry

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_uri = f"file://{tmp_path / 'runs' / 'r1'}"
    name = f"m-{'good' if improves else 'bad'}"
    _plant_report(run_uri, {"math": 0.7 if improves else 0.2}, {"math": 0.4})
    dr = _test_dag("test_gate_flow").test(
        run_conf={"run_uri": run_uri, "promote_config": json.dumps({"model_name": name})}
    )
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    gate_ti = next(ti for ti in dr.get_task_instances() if ti.task_id == "gate")
    links = _links(gate_ti)
    assert links["posttrain_mlflow_run"]["run_id"] and links["posttrain_checkpoint"]["browse_url"] == f"{run_uri}/gate"
    if improves:
        assert states["promote"] == "success" and states["blocked"] == "skipped"
        assert registry.champion(name) is not None
    else:
        assert states["promote"] == "skipped" and states["blocked"] == "success"
        assert registry.champion(name) is None


def test_a_recipes_timeouts_reach_each_stage_task(tmp_path: Path, dagbag) -> None:
    """The DAGs' stage tasks render their recipe's timeout (a round falls back to `rl_round`), and the operator
    launches the stage with it: a real process, stopped by the launcher when it runs past."""
    import sys

    from operators.launchers.base import StageTimeout
    from operators.launchers.local import LocalProcessLauncher
    from operators.pipeline import MACROS
    from tests.training.test_recipes import write_recipe

    path = write_recipe(tmp_path, timeouts={"sft": "4h", "rl_round": "8h", "rl_round_2": 1, "taskset": "30m"})
    params = {"recipe": str(path)}
    rendered = {}
    for dag_id in ("post_training", "taskset_refresh"):
        for task in dagbag.dags[dag_id].tasks:
            if getattr(task, "timeout", None):
                rendered[(dag_id, task.task_id)] = jinja2.Template(task.timeout).render(**MACROS, params=params)
    assert rendered[("post_training", "build_taskset")] == rendered[("taskset_refresh", "build_taskset")] == "1800"
    assert rendered[("post_training", "sft")] == "14400"
    assert rendered[("post_training", "rl_round_1")] == "28800" and rendered[("post_training", "rl_round_2")] == "1"
    assert rendered[("post_training", "evaluate")] == rendered[("post_training", "gate")] == ""  # the spec's

    class Sleeper(LocalProcessLauncher):  # the stage's command swapped for one that outlives its timeout
        def run(self, spec, argv, env, on_line):  # type: ignore[no-untyped-def]
            launched.append(spec)
            return super().run(spec, [sys.executable, "-c", "import time; time.sleep(60)"], env, on_line)

    launched: list = []
    op = dagbag.dags["post_training"].get_task("rl_round_2")
    timeout = rendered[("post_training", "rl_round_2")]
    op = op.__class__(task_id="rl_round_2_probe", spec=op.spec, run_uri="file:///tmp/none", timeout=timeout)
    op.make_launcher = lambda: Sleeper(grace_s=1)  # type: ignore[method-assign]
    op.stage_env = lambda: {}  # type: ignore[method-assign]
    with pytest.raises(StageTimeout, match="timeout of 1s"):
        op.execute({})
    assert launched[0].timeout_s == 1 and op.spec.timeout_s == 6 * 3600
    op.timeout = "soon"
    with pytest.raises(ValueError, match="timeout 'soon' is not a number of seconds"):
        op.execute({})
