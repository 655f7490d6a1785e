from __future__ import annotations

import json

from operators.stage_operator import PosttrainStageOperator, browse_url
from plugins.links import CheckpointLink, MlflowRunLink


def test_plugin_registers_both_links() -> None:
    from airflow import plugins_manager

    _, operator_links = plugins_manager._get_extra_operators_links_plugins()
    assert {type(link) for link in operator_links} >= {MlflowRunLink, CheckpointLink}
    assert {link.name for link in PosttrainStageOperator.operator_extra_links} == {"MLflow run", "Checkpoint"}


def test_link_formats() -> None:
    assert (
        MlflowRunLink.format_str.format(ui_url="http://m:5000", experiment_id="3", run_id="ab")
        == "http://m:5000/#/experiments/3/runs/ab?workflowType=machine_learning"
    )
    # Never the S3 endpoint's raw XML: the configured browser (the stack's Airflow plugin, MinIO's console) ...
    stack = {
        "POSTTRAIN_BROWSE_URL": "http://127.0.0.1:8080/posttrain/browse?uri={uri}",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
    }
    assert (
        browse_url("s3://posttrain/runs/r1/sft", stack)
        == "http://127.0.0.1:8080/posttrain/browse?uri=s3%3A%2F%2Fposttrain%2Fruns%2Fr1%2Fsft"
    )
    minio = {"POSTTRAIN_BROWSE_URL": "http://localhost:9001/browser/{bucket}/{key}"}
    assert browse_url("s3://posttrain/runs/r1/sft", minio) == "http://localhost:9001/browser/posttrain/runs/r1/sft/"
    # ... or AWS's console.
    assert browse_url("s3://b/runs/r1/sft", {}).startswith("https://s3.console.aws.amazon.com/s3/buckets/b?")
    assert browse_url("file:///tmp/r1/sft", {}) == "file:///tmp/r1/sft"


def test_storage_browser_lists_a_stage_folder(tmp_path, monkeypatch) -> None:
    """The page the Checkpoint link opens: a manifested folder's files with sizes and hashes, sub-folders, and
    each file readable; URIs outside the browse roots are refused."""
    from fastapi.testclient import TestClient

    from plugins import browse
    from training import storage

    root = f"file://{tmp_path}/runs"
    monkeypatch.setenv("POSTTRAIN_BROWSE_ROOTS", root + "/")
    writer = storage.ManifestWriter(f"{root}/r1/sft")
    writer.put_bytes(b"weights", "model/model.safetensors")
    writer.put_json({"step": 3}, "checkpoints/step-3/state.json")
    writer.commit()
    browse.app.dependency_overrides[browse._user()] = lambda: "tester"
    try:
        client = TestClient(browse.app)
        page = client.get("/browse", params={"uri": f"{root}/r1/sft"})
        assert page.status_code == 200 and "complete: manifest written" in page.text
        assert "model/model.safetensors" in page.text and "7 B" in page.text and "checkpoints/" in page.text
        assert client.get("/file", params={"uri": f"{root}/r1/sft/model/model.safetensors"}).content == b"weights"
        run = client.get("/browse", params={"uri": f"{root}/r1"})
        assert "no manifest here" in run.text and "sft/" in run.text
        assert client.get("/browse", params={"uri": f"file://{tmp_path}/elsewhere"}).status_code == 403
        assert client.get("/browse", params={"uri": f"{root}/../x"}).status_code == 403
    finally:
        browse.app.dependency_overrides.clear()


def test_sandbox_connection_becomes_stage_env(monkeypatch) -> None:
    # An Airflow connection defined the standard way (AIRFLOW_CONN_*), read through Airflow's own lookup.
    from plugins.hooks import SandboxServiceHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_SANDBOX_DEFAULT",
        json.dumps({"conn_type": "http", "host": "sandbox", "port": 8081, "password": "s3cret"}),
    )
    assert SandboxServiceHook().stage_env() == {
        "POSTTRAIN_SANDBOX_URL": "http://sandbox:8081",
        "POSTTRAIN_SANDBOX_TOKEN": "s3cret",
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_SANDBOX_DEFAULT",
        json.dumps({"conn_type": "http", "host": "https://sandbox.internal", "password": "t"}),
    )
    assert SandboxServiceHook().stage_env()["POSTTRAIN_SANDBOX_URL"] == "https://sandbox.internal"
    # No connection: the worker's own environment, if any
    monkeypatch.delenv("AIRFLOW_CONN_SANDBOX_DEFAULT")
    monkeypatch.setenv("POSTTRAIN_SANDBOX_URL", "http://127.0.0.1:8090")
    monkeypatch.delenv("POSTTRAIN_SANDBOX_TOKEN", raising=False)
    assert SandboxServiceHook().stage_env() == {"POSTTRAIN_SANDBOX_URL": "http://127.0.0.1:8090"}
