"""Cycle-to-cycle tracking (training/evaluation/lineage.py) over consecutive fake nights: each night is a real
pipeline parent run (training/tracking.py) with a `taskset` stage and an `evaluate` stage whose body calls
`record_cycle`, against a real MLflow store and registry (SQLite) and file:// run folders."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from training import cli, registry, stage, storage, tracking
from training.config import ConfigBase
from training.evaluation import lineage

MODEL = "lineage-tiny"


@dataclass(frozen=True)
class NightConfig(ConfigBase):
    """Config of the fake stages (what the manifests record)."""

    night: int = 0


@pytest.fixture
def mlflow_store(local_mlflow: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # the SQLite store puts artifacts under ./mlruns of the working directory: keep them in the test's folder
    monkeypatch.chdir(tmp_path)
    return local_mlflow


def report_of(pass1: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The part of the evaluate report record_cycle reads: the candidate's pass@1 counts per domain."""
    domains = {d: {"pass1": {"passed": p, "total": t}} for d, (p, t) in pass1.items()}
    return {"models": {"candidate": {"domains": domains}, "sft": {"domains": domains}}}


def shared_taskset(root: Path, name: str, report: dict[str, Any]) -> storage.Manifest:
    """A task set built by taskset_refresh into the shared folder (only report.json matters here)."""
    writer = storage.ManifestWriter(f"file://{root / 'tasksets' / name}")
    writer.put_json(report, "report.json")
    return writer.commit(config={"night": name})


def promote_champion(root: Path, name: str) -> registry.Champion:
    ckpt = storage.ManifestWriter(f"file://{root / 'checkpoints' / name}")
    ckpt.put_bytes(b"weights", "model/w.bin")
    return registry.promote(ckpt.commit().uri, MODEL)


def night(
    root: Path,
    night_no: int,
    pass1: dict[str, tuple[int, int]],
    adopt: storage.Manifest | None = None,
    own_report: dict[str, Any] | None = None,
    body_hook: Any = None,
) -> tuple[str, str]:
    """One nightly pipeline run: its task set (adopted from `adopt`, else built in the run with `own_report`),
    then evaluate calling record_cycle with the registered champion; (pipeline run id, MLflow parent run id)."""
    run_id = f"nightly-{night_no}-{uuid.uuid4().hex[:6]}"
    run_uri = f"file://{root / 'runs' / run_id}"
    if adopt is not None:
        assert cli.main(["adopt", "--source", adopt.uri, "--as", "taskset", "--run", run_uri]) == 0
    else:

        def build(ctx: stage.StageContext) -> dict[str, Any]:
            ctx.writer.put_json(own_report or {}, "report.json")
            return {}

        stage.run_stage("taskset", NightConfig(night_no), run_uri, build)

    def evaluate(ctx: stage.StageContext) -> dict[str, Any]:
        if body_hook is not None:
            body_hook(ctx)
        cycle = lineage.record_cycle(ctx, report_of(pass1), MODEL, registry.champion(MODEL))
        return {"runs": cycle["runs"]}

    result = stage.run_stage("evaluate", NightConfig(night_no), run_uri, evaluate)
    assert result.summary["runs"] >= 1
    parent = tracking.end_pipeline_run(run_id, "FINISHED")
    assert parent is not None
    return run_uri, parent


def artifact_json(client: Any, run_id: str, path: str, dst: Path) -> Any:
    dst.mkdir(parents=True, exist_ok=True)
    return json.loads(Path(client.download_artifacts(run_id, path, str(dst))).read_text())


def test_three_nights_tag_their_lineage_and_the_history_holds_each_nights_pass1(mlflow_store, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    v1 = shared_taskset(tmp_path, "v1", {"tasks": 10})  # a task set from before feedback: no "feedback" key
    batches = [
        {"batch": "batch-aaa", "uri": "file:///fb/batch-aaa", "records": 3},
        {"batch": "batch-bbb", "uri": "file:///fb/batch-bbb", "records": 5},
    ]
    v2 = shared_taskset(tmp_path, "v2", {"tasks": 12, "feedback": {"batches": batches, "records": 8}})
    champ1 = promote_champion(tmp_path, "c1")
    pass1s = [
        {"math": (1, 4), "extraction": (2, 4)},
        {"math": (2, 4), "extraction": (1, 4)},
        {"math": (3, 4), "extraction": (3, 4)},
    ]

    _, p1 = night(tmp_path, 1, pass1s[0], adopt=v1)
    champ2 = promote_champion(tmp_path, "c2")  # night 1 promoted its candidate
    _, p2 = night(tmp_path, 2, pass1s[1], adopt=v2)
    client.delete_registered_model_alias(MODEL, registry.CHAMPION)  # night 3: no champion to compare with
    own = {"feedback": {"batches": [{"batch": "batch-ccc", "uri": "file:///fb/batch-ccc"}]}}
    uri3, p3 = night(tmp_path, 3, pass1s[2], own_report=own)

    runs = [client.get_run(p) for p in (p1, p2, p3)]
    tags = [r.data.tags for r in runs]
    assert [t[lineage.MODEL_TAG] for t in tags] == [MODEL] * 3
    assert [t.get("posttrain.champion_version") for t in tags] == [champ1.version, champ2.version, None]
    assert [t.get("posttrain.champion_source") for t in tags] == [champ1.source, champ2.source, None]
    own_taskset = storage.require_manifest(storage.join(uri3, "taskset"))
    assert [t["posttrain.taskset_uri"] for t in tags] == [v1.uri, v2.uri, own_taskset.uri]
    assert [t["posttrain.taskset_created_at"] for t in tags] == [v1.created_at, v2.created_at, own_taskset.created_at]
    assert [t["posttrain.feedback_batches"] for t in tags] == ["", "batch-aaa,batch-bbb", "batch-ccc"]

    found = artifact_json(client, p2, "lineage.json", tmp_path / "dl2")
    assert found["champion"] == {"name": MODEL, "version": champ2.version, "source": champ2.source, "run_id": None}
    assert found["taskset"] == {"uri": v2.uri, "created_at": v2.created_at}
    assert [(b["batch"], b["uri"], b["records"]) for b in found["feedback_batches"]] == [
        ("batch-aaa", "file:///fb/batch-aaa", 3),
        ("batch-bbb", "file:///fb/batch-bbb", 5),
    ]
    assert artifact_json(client, p3, "lineage.json", tmp_path / "dl3")["champion"] is None

    expected = [{d: p / t for d, (p, t) in night_pass1.items()} for night_pass1 in pass1s]
    for run, want in zip(runs, expected, strict=True):
        assert {k: v for k, v in run.data.metrics.items() if k.startswith("holdout.pass1.")} == {
            f"holdout.pass1.{d}": v for d, v in want.items()
        }
    series = artifact_json(client, p3, lineage.HISTORY_JSON, tmp_path / "dl3h")
    assert [s["run_id"] for s in series] == [p1, p2, p3]  # oldest first, this night last
    assert [s["pass1"] for s in series] == expected
    assert [s["run_id"] for s in artifact_json(client, p2, lineage.HISTORY_JSON, tmp_path / "dl2h")] == [p1, p2]
    for parent in (p1, p2, p3):
        assert lineage.HISTORY_PNG in {a.path for a in client.list_artifacts(parent, "history")}
    png = Path(client.download_artifacts(p3, lineage.HISTORY_PNG, str(tmp_path / "png")))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_chart_that_fails_to_draw_is_a_warning_not_a_failed_stage(
    mlflow_store, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mlflow.tracking import MlflowClient

    def broken(series: list[dict[str, Any]]) -> Any:
        raise RuntimeError("no fonts")

    monkeypatch.setattr(lineage, "history_figure", broken)
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        _, parent = night(tmp_path, 1, {"math": (1, 2)}, own_report={})
    assert "no fonts" in caplog.text
    client = MlflowClient()
    assert {a.path for a in client.list_artifacts(parent, "history")} == {lineage.HISTORY_JSON}
    assert client.get_run(parent).data.metrics["holdout.pass1.math"] == 0.5


def test_tags_that_cannot_be_written_fail_the_stage(mlflow_store, tmp_path) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    def lose_parent(ctx: stage.StageContext) -> None:  # the parent run deleted under the stage: no tag can land
        MlflowClient().delete_run(ctx.mlflow.parent_run_id)

    with pytest.raises(MlflowException):
        night(tmp_path, 1, {"math": (1, 2)}, own_report={}, body_hook=lose_parent)
    assert not list((tmp_path / "runs").glob("*/evaluate/manifest.json"))  # the stage did not complete
