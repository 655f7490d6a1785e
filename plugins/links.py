"""Extra links on every stage task: its MLflow run and its output folder."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import BaseOperatorLink


class _XComFormatLink(BaseOperatorLink):
    """`format_str` filled from the dict the operator pushed to XCom under `key`; empty until it ran."""

    name: ClassVar[str]
    key: ClassVar[str]
    format_str: ClassVar[str]

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        try:
            conf = XCom.get_value(key=self.key, ti_key=ti_key)
            return self.format_str.format(**conf) if conf else ""
        except Exception:  # noqa: BLE001 - a link must never break the task page
            return ""

    @classmethod
    def persist(cls, context: Any, **fields: str) -> None:
        context["ti"].xcom_push(key=cls.key, value=fields)


class MlflowRunLink(_XComFormatLink):
    name = "MLflow run"
    key = "posttrain_mlflow_run"
    # MLflow 3's UI opens in its GenAI view unless told otherwise (it keeps the choice per browser, not per
    # experiment): these runs are model training.
    format_str = "{ui_url}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


class CheckpointLink(_XComFormatLink):
    name = "Checkpoint"
    key = "posttrain_checkpoint"
    format_str = "{browse_url}"
