from __future__ import annotations

from operators.stage_operator import PosttrainStageOperator, browse_url
from plugins.links import CheckpointLink, MlflowRunLink


def test_plugin_registers_both_links() -> None:
    from airflow import plugins_manager

    _, operator_links = plugins_manager._get_extra_operators_links_plugins()
    assert {type(link) for link in operator_links} >= {MlflowRunLink, CheckpointLink}
    assert {link.name for link in PosttrainStageOperator.operator_extra_links} == {"MLflow run", "Checkpoint"}


def test_link_formats() -> None:
    assert MlflowRunLink.format_str.format(ui_url="http://m:5000", experiment_id="3", run_id="ab") == \
        "http://m:5000/#/experiments/3/runs/ab"
    assert browse_url("s3://posttrain/runs/r1/sft", {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000"}) == \
        "http://127.0.0.1:9000/posttrain?prefix=runs/r1/sft/"
    assert browse_url("s3://b/runs/r1/sft", {}).startswith("https://s3.console.aws.amazon.com/s3/buckets/b?")
    assert browse_url("file:///tmp/r1/sft", {}) == "file:///tmp/r1/sft"
