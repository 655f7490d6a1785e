"""The loop a user runs, twice: a recipe for their chat model drives `taskset_refresh` -> `nightly_retraining` on
two nights, the second with more data and a production feedback file in the recipe's inbox.

The model is a Qwen2-architecture chat model built from config inside the test (ChatML template, two eos ids),
registered as the champion the first night starts from; the data are GSM8K- and HumanEval-shaped JSONL files.
The whole embedded stack runs for the module as `make up` starts it (S3-compatible server, MLflow server, Airflow
API server, scheduler and DAG processor), with the recipe as POSTTRAIN_RECIPE, as a deployment's scheduled runs
read it. The test only does what a user does: it triggers `taskset_refresh` when data arrived; the scheduler
starts `nightly_retraining` from the task-set Asset event the refresh's publish emits. Each stage is a real
`posttrain` process. What is checked is the loop's contract, not what a random model learns:
- each night's retraining was started by the scheduler, from the Asset event of that night's refresh;
- every night's stages run with the recipe's preset (its base model's size tier: lr, KL, engine), never the
  tiny profile's;
- the holdout does not move: night 1's held-out ids are all held out on night 2, and no held-out id of either
  night is in either night's train split;
- the feedback file's good rows become tasks and the field slice (evaluated and in the gate), its bad rows are
  refused naming file, row and field and kept in quarantine; the second night's parent run names the champion it
  started from, the task set and the feedback batch.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

from infra.local.demo import Airflow, wait_for_dag
from tests.stack_runs import running_stack
from tests.training.stages.test_pretrained_chat_path import MATH_INSTRUCTION, gsm8k_rows, humaneval_rows
from training import storage
from training.modeling.synthetic_models import build_chatml_qwen2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
TS = "2026-12-05T10:00:00Z"
LOWER = {"id": "change_case:english_lowercase"}

# Cut to what a 2-core machine runs in a few minutes a night; the preset's own settings (lr, beta, engine,
# LoRA or not, gradient checkpointing) are left alone, and those are what the test asserts.
STAGES = {
    "rl_round": {"steps": 1, "prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 32,
                 "holdout_per_domain": 4, "micro_batch_size": 16},
    "evaluate": {"max_tasks_per_domain": 6, "n_samples": 1, "ks": [1], "long_context_tasks": 0,
                 "max_new_tokens": 48, "repair_turns": 0},
    "gate": {"tolerance": 1, "min_samples": 3, "require_any_pass": False},
}  # fmt: skip


def feedback_rows() -> tuple[list[dict], list[bytes]]:
    """Night 2's production log: good rows (two corrections, three rated chat answers, two verifiable by their
    constraints) and bad ones (missing prompt, rating 7, broken JSON, a duplicate)."""
    base = {"response": "I think 12.", "timestamp": TS, "model_version": "1"}
    good = [
        {**base, "prompt": "Ada has 7 cards. Bo gives Ada 5 more. How many cards now?", "domain": "math",
         "answer": "12", "verifier": "math", "thumbs": "down"},
        {**base, "prompt": "Kim has 30 pens. Lu gives Kim 4 more. How many pens now?", "domain": "math",
         "answer": "34", "verifier": "math", "rating": 0.0},
        {**base, "prompt": "Reply in lower case: greet the new team", "domain": "chat", "verifier": "ifeval",
         "metadata": {"constraints": [LOWER]}, "rating": 0.25},
        {**base, "prompt": "Reply in lower case: thank the reviewers", "domain": "chat", "verifier": "ifeval",
         "metadata": {"constraints": [LOWER]}, "thumbs": "up"},
        {**base, "prompt": "Summarise the outage report", "domain": "chat", "thumbs": "down"},
    ]  # fmt: skip
    bad = [
        json.dumps({**base, "domain": "chat", "thumbs": "up"}).encode(),  # row 6: no prompt
        json.dumps({**base, "prompt": "Rate me", "domain": "chat", "rating": 7}).encode(),  # row 7
        b'{"prompt": "broken',  # row 8
        json.dumps(good[2]).encode(),  # row 9: a duplicate of row 3
    ]
    return good, bad


RUN_TIMEOUT_S = 1500  # a guard for a shared machine, not the expected time


class DagRun:
    """One DAG run as the REST API shows it: its state, its tasks' states and their return values."""

    def __init__(self, api: Airflow, dag_id: str, run: dict) -> None:
        self.api, self.dag_id, self.run = api, dag_id, run
        self.run_id: str = run["dag_run_id"]

    @property
    def state(self) -> str:
        return self.run["state"]

    def task_states(self) -> dict[str, str]:
        path = f"/api/v2/dags/{self.dag_id}/dagRuns/{self.run_id}/taskInstances?limit=100"
        return {t["task_id"]: t["state"] for t in self.api.call("GET", path)["task_instances"]}

    def result(self, task: str) -> dict:
        path = f"/api/v2/dags/{self.dag_id}/dagRuns/{self.run_id}/taskInstances/{task}/xcomEntries/return_value"
        value = self.api.call("GET", path)["value"]
        return json.loads(value) if isinstance(value, str) else value


def _wait(api: Airflow, dag_id: str, run_id: str) -> DagRun:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        if run["state"] in ("success", "failed"):
            return DagRun(api, dag_id, run)
        time.sleep(3)
    raise AssertionError(f"{dag_id} {run_id} did not finish in {RUN_TIMEOUT_S}s")


def _runs(api: Airflow, dag_id: str) -> list[dict]:
    return api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after&limit=50")["dag_runs"]


def _next_scheduled(api: Airflow, seen: set[str]) -> dict:
    """The nightly run the scheduler starts after a refresh (not one of `seen`)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        new = [r for r in _runs(api, "nightly_retraining") if r["dag_run_id"] not in seen]
        if new:
            (run,) = new
            return run
        time.sleep(2)
    raise AssertionError("the scheduler started no nightly_retraining run after the task-set refresh")


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from training import registry

    root = tmp_path_factory.mktemp("loop")
    gsm, he = gsm8k_rows(200), humaneval_rows(24)
    corpus = [r["question"] + " " + r["answer"] for r in gsm] + [r["prompt"] + r["canonical_solution"] for r in he]
    corpus += [MATH_INSTRUCTION, "user assistant system reply in lower case greet thank summarise"]
    model_dir = build_chatml_qwen2(root / "support-chat", corpus)
    name = f"loop-{uuid.uuid4().hex[:6]}"
    data, inbox = root / "data", root / "inbox"
    data.mkdir()
    inbox.mkdir()
    (data / "humaneval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in he))
    recipe = {
        "model_name": name,
        "base_model": str(model_dir),
        "rounds": 1,
        "holdout_fraction": 0.2,
        "split_salt": f"{name}-v1",
        "domains": {
            "math": {"weight": 0.6, "sources": [{"path": str(data / "gsm8k.jsonl"), "adapter": "gsm8k"}]},
            "code": {"weight": 0.4, "sources": [{"path": str(data / "humaneval.jsonl"), "adapter": "humaneval"}]},
        },
        "feedback": {"inbox": str(inbox), "root": f"s3://posttrain/feedback/{name}"},
        "stages": STAGES,
    }
    recipe_path = root / f"{name}.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))

    # The loop without its clocks: with catchup off, Airflow runs a clocked DAG once for its latest tick when it
    # is unpaused, which would start a night nobody asked for; what runs here is started by the refresh's event.
    # The DAG files do not change: parse them once, not every 30 s, so the 2 cores go to the stages.
    env = {
        "POSTTRAIN_RECIPE": str(recipe_path),
        "POSTTRAIN_NIGHTLY_CRON": "off",
        "POSTTRAIN_REFRESH_SCHEDULE": "off",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    }
    with running_stack(root / "stack", env=env) as stack:
        # The user's model is the first champion: uploaded as a model folder and registered.
        champion_uri = f"s3://posttrain/models/{name}-base"
        writer = storage.ManifestWriter(champion_uri)
        writer.put_dir(model_dir, "model")
        writer.commit(config={"uploaded_from": str(model_dir)})
        registry.promote(champion_uri, name)

        api = Airflow(stack.airflow_url, stack.airflow_password() or "")
        api.login()
        for dag_id in ("taskset_refresh", "nightly_retraining"):
            wait_for_dag(api, dag_id=dag_id)
            api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        nights = []
        for night in (1, 2):
            if night == 1:
                rows = gsm[:160]
            else:  # the data changed: ten rows gone, forty new, and the production log arrived
                rows = gsm[10:200]
                good, bad = feedback_rows()
                lines = [json.dumps(r).encode() for r in good] + bad
                (inbox / "2026-12-05.jsonl").write_bytes(b"\n".join(lines) + b"\n")
            (data / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            seen = {r["dag_run_id"] for r in _runs(api, "nightly_retraining")}
            # what the user does: a refresh (no conf: the recipe is the deployment's, as for the weekly run)
            triggered = api.call("POST", "/api/v2/dags/taskset_refresh/dagRuns", {"logical_date": None, "conf": {}})
            refresh = _wait(api, "taskset_refresh", triggered["dag_run_id"])
            assert refresh.state == "success", (night, refresh.task_states())
            nightly = _wait(api, "nightly_retraining", _next_scheduled(api, seen)["dag_run_id"])
            nights.append({"refresh": refresh, "nightly": nightly})
        yield {
            "name": name, "nights": nights, "recipe": recipe_path, "inbox": inbox, "champion_uri": champion_uri,
            "api": api,
        }  # fmt: skip


def _splits(manifest, tmp: Path) -> dict[str, set[str]]:
    from training.tasksets.io import load_stage_tasks

    return {s: {t.id for t in load_stage_tasks(manifest, s, tmp / s)} for s in ("train", "holdout")}


def test_the_scheduler_starts_each_night_from_its_refreshs_task_set_event(loop) -> None:
    api = loop["api"]
    for night in loop["nights"]:
        nightly, refresh = night["nightly"], night["refresh"]
        assert nightly.run["run_type"] == "asset_triggered" and nightly.run["conf"] == {}
        path = f"/api/v2/dags/nightly_retraining/dagRuns/{nightly.run_id}/upstreamAssetEvents"
        events = api.call("GET", path)["asset_events"]
        assert [(e["source_dag_id"], e["source_run_id"], e["source_task_id"]) for e in events] == [
            ("taskset_refresh", refresh.run_id, "publish")
        ]


def test_both_nights_run_with_the_recipes_preset(loop) -> None:
    for n, night in enumerate(loop["nights"], start=1):
        for key in ("refresh", "nightly"):
            dr = night[key]
            assert dr.state == "success", (n, key, dr.task_states())
        nightly = night["nightly"]
        rl = storage.require_manifest(nightly.result("rl_round_1")["manifest_uri"].rsplit("/", 1)[0])
        # the <= 1.5B tier (the model's config.json sizes it), never the tiny profile's lr 2e-4 / hf engine
        assert rl.config["lr"] == 1e-6 and rl.config["beta"] == 0.001 and rl.config["rollout_engine"] == "auto"
        assert rl.config["gradient_checkpointing"] is True and rl.config["temperature"] == 1.0
        ev = storage.require_manifest(nightly.result("evaluate")["manifest_uri"].rsplit("/", 1)[0])
        assert ev.config["model_name"] == loop["name"] and ev.config["batch_size"] == 64
        assert nightly.task_states()["gate"] == "success"


def test_the_holdout_does_not_move_and_never_meets_train(loop, tmp_path) -> None:
    sets = []
    for n, night in enumerate(loop["nights"], start=1):
        built = night["refresh"].result("build_taskset")
        manifest = storage.require_manifest(built["manifest_uri"].rsplit("/", 1)[0])
        assert storage.read_json(manifest, "report.json")["split"]["mode"] == "hash"
        sets.append(_splits(manifest, tmp_path / str(n)))
    one, two = sets
    # night 1's holdout tasks that still exist on night 2 are all held out there (ten rows were removed)
    still = {i for i in one["holdout"] if i in two["train"] | two["holdout"]}
    assert still and still <= two["holdout"]
    for a in sets:
        for b in sets:
            assert not a["holdout"] & b["train"]
    assert len(two["holdout"]) > len(still)  # the new rows brought new holdout tasks


def test_feedback_rows_become_tasks_and_the_field_slice_and_bad_rows_are_kept(loop, tmp_path) -> None:
    first, second = (n["refresh"].result("import_feedback") for n in loop["nights"])
    assert first["summary"]["batches"] == [] and second["summary"]["accepted"] == 5
    (batch,) = second["summary"]["batches"]
    manifest = storage.require_manifest(storage.join(f"s3://posttrain/feedback/{loop['name']}", batch))
    quarantine = [json.loads(x) for x in storage.read_bytes(manifest, "quarantine.jsonl").decode().splitlines()]
    assert [(q["row"], q["errors"][0]["field"]) for q in quarantine] == [
        (6, "prompt"), (7, "rating"), (8, None), (9, "id")
    ]  # fmt: skip
    assert "duplicate of row 3" in quarantine[3]["errors"][0]["message"]
    report = storage.read_json(manifest, "report.json")
    assert any(e.startswith(f"{loop['inbox'] / '2026-12-05.jsonl'}:6: field 'prompt'") for e in report["examples"])

    built = loop["nights"][1]["refresh"].result("build_taskset")
    taskset = storage.require_manifest(built["manifest_uri"].rsplit("/", 1)[0])
    fb = storage.read_json(taskset, "report.json")["feedback"]
    assert fb["tasks"] == 2 and fb["field"] == 3 and fb["field_verifiable"] == 2
    assert [b["batch"] for b in fb["batches"]] == [batch]

    # night 2's evaluation measured the field slice and the gate paired it with the champion
    nightly = loop["nights"][1]["nightly"]
    ev = storage.require_manifest(nightly.result("evaluate")["manifest_uri"].rsplit("/", 1)[0])
    field = storage.read_json(ev, "report.json")["field"]
    assert field["records"] == 3 and field["production"]["failure_rate"] == pytest.approx((0.75 + 0 + 1) / 3)
    assert field["models"]["candidate"]["tasks"] == 2
    gate = storage.require_manifest(nightly.result("gate")["manifest_uri"].rsplit("/", 1)[0])
    verdict = storage.read_bytes(gate, "verdict.md").decode()
    assert "field" in verdict


def test_each_night_names_what_it_started_from_and_the_history_is_plotted(loop, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    parents = []
    for night in loop["nights"]:
        child = client.get_run(night["nightly"].result("evaluate")["mlflow_run_id"])
        parents.append(client.get_run(child.data.tags["mlflow.parentRunId"]))
    one, two = parents
    built = [n["refresh"].result("build_taskset")["manifest_uri"].rsplit("/", 1)[0] for n in loop["nights"]]
    assert one.data.tags["posttrain.champion_version"] == "1"
    assert one.data.tags["posttrain.champion_source"] == loop["champion_uri"]
    assert [p.data.tags["posttrain.taskset_uri"] for p in parents] == built
    (batch,) = loop["nights"][1]["refresh"].result("import_feedback")["summary"]["batches"]
    assert one.data.tags["posttrain.feedback_batches"] == "" and two.data.tags["posttrain.feedback_batches"] == batch
    # night 2 started from whichever champion night 1 left (promoted: version 2)
    promoted = loop["nights"][0]["nightly"].task_states()["promote"] == "success"
    assert two.data.tags["posttrain.champion_version"] == ("2" if promoted else "1")
    assert {"holdout.pass1.math", "holdout.pass1.code", "holdout.pass1.field"} <= set(two.data.metrics)
    series = json.loads(
        open(client.download_artifacts(two.info.run_id, "history/holdout_pass1.json", str(tmp_path))).read()
    )
    assert [r["run_id"] for r in series] == [one.info.run_id, two.info.run_id]
    assert series[0]["pass1"]["math"] == one.data.metrics["holdout.pass1.math"]
    artifacts = {a.path for a in client.list_artifacts(two.info.run_id, "history")}
    assert "history/holdout_pass1.png" in artifacts
    lineage = json.loads(open(client.download_artifacts(two.info.run_id, "lineage.json", str(tmp_path))).read())
    assert lineage["feedback_batches"][0]["batch"] == batch
