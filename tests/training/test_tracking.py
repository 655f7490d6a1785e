"""Tracking against the real MLflow server of the local stack (artifacts stored in its S3 server)."""

from __future__ import annotations

import uuid

import pytest

from training import tracking


@pytest.mark.slow
def test_nested_stage_runs_visible_through_client(local_stack) -> None:
    from mlflow.tracking import MlflowClient

    run_id = f"pipeline-{uuid.uuid4().hex[:8]}"
    with tracking.stage_run(run_id, "build_taskset") as ts:
        ts.log_params({"domains": ["math", "code"], "seed": 1, "mix": {"math": 0.5}})
        ts.log_metrics({"tasks": 120.0}, step=0)
        ts.log_dict({"counts": {"math": 60}}, "taskset/counts.json")
        ts.log_table([{"id": "m1", "prompt": "1+1"}, {"id": "m2", "prompt": "2+2"}], "samples.json")
    with tracking.stage_run(run_id, "sft") as sft:
        for step in range(3):
            sft.log_metrics({"loss": 2.0 - step * 0.5}, step=step)

    client = MlflowClient()
    parent_id = tracking.pipeline_run_id(run_id)
    assert ts.parent_run_id == sft.parent_run_id == parent_id
    children = client.search_runs([ts.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert sorted(r.data.tags[tracking.STAGE_TAG] for r in children) == ["build_taskset", "sft"]
    assert all(r.info.status == "FINISHED" for r in children)

    sft_run = client.get_run(sft.run_id)
    assert [m.value for m in client.get_metric_history(sft.run_id, "loss")] == [2.0, 1.5, 1.0]
    assert sft_run.data.tags[tracking.RUN_TAG] == run_id
    ts_run = client.get_run(ts.run_id)
    assert ts_run.data.params["mix.math"] == "0.5" and ts_run.data.params["domains"] == '["math", "code"]'
    artifacts = {a.path for a in client.list_artifacts(ts.run_id)}
    assert {"taskset", "samples.json"} <= artifacts
    # The artifact really went through the server into the S3 bucket.
    import boto3

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="mlflow").get("Contents", [])]
    assert any(k.endswith(f"{ts.run_id}/artifacts/samples.json") for k in keys)


@pytest.mark.slow
def test_failed_stage_marked_failed_and_resumed_on_retry(local_stack) -> None:
    from mlflow.tracking import MlflowClient

    run_id = f"pipeline-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError), tracking.stage_run(run_id, "rl_round_1") as first:
        first.log_metrics({"reward": 0.1}, step=1)
        raise RuntimeError("killed mid-round")
    client = MlflowClient()
    assert client.get_run(first.run_id).info.status == "FAILED"
    with tracking.stage_run(run_id, "rl_round_1") as second:
        second.log_metrics({"reward": 0.2}, step=2)
    assert second.run_id == first.run_id  # the retry continues the same MLflow run
    assert [m.step for m in client.get_metric_history(first.run_id, "reward")] == [1, 2]
    assert client.get_run(first.run_id).info.status == "FINISHED"


def test_unreachable_server_fails_fast_with_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.local.stack import free_port

    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    with pytest.raises(tracking.TrackingUnavailable) as err:
        tracking.ensure_reachable(timeout_s=1)
    assert url in str(err.value) and "make up" in str(err.value)


def test_missing_tracking_uri_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(tracking.TrackingUnavailable, match="MLFLOW_TRACKING_URI is not set"):
        tracking.tracking_uri()


def test_a_stage_shorter_than_the_sampling_interval_still_logs_system_metrics(local_mlflow) -> None:
    """MLflow's monitor publishes only after one interval: a stage that ends sooner must still show system metrics
    (the MLflow run page's System metrics tab, which the browser test opens)."""
    import time

    from mlflow.tracking import MlflowClient

    with tracking.stage_run(f"pipeline-{uuid.uuid4().hex[:8]}", "sft") as sft, sft.system_metrics(30):
        time.sleep(0.5)
    metrics = MlflowClient().get_run(sft.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics, sorted(metrics)
