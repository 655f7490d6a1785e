"""End the pipeline's MLflow parent run when the DAG run ends: FINISHED, or FAILED when a task failed.

Stages open their nested runs under a parent run that the first stage creates; no stage knows it is the last,
so the parent would stay RUNNING. This teardown task runs after promote/blocked whatever happened upstream (a
teardown does not decide the DAG run's state) and closes the parent with the DAG run's outcome. The tag
`posttrain.outcome` says promoted, blocked or failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from plugins.hooks import MlflowHook
from training.stage import run_id_of  # stdlib-only at import time: no torch here

FAILED_STATES = ("failed", "upstream_failed")


def outcome(states: dict[str, str | None]) -> tuple[str, str]:
    """(MLflow run status, outcome tag) from the states of the DAG run's tasks (this one left out)."""
    if any(state in FAILED_STATES for state in states.values()):
        return "FAILED", "failed"
    if states.get("promote") == "success":
        return "FINISHED", "promoted"
    if states.get("blocked") == "success":
        return "FINISHED", "blocked"
    return "FINISHED", "finished"


class EndTrackingOperator(BaseOperator):
    """Close the MLflow parent run of pipeline run `run_uri` (templated) with the DAG run's outcome."""

    template_fields: Sequence[str] = ("run_uri",)
    ui_color = "#eeeeee"

    def __init__(
        self, *, run_uri: str, mlflow_conn_id: str | None = MlflowHook.default_conn_name, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.run_uri = run_uri
        self.mlflow_conn_id = mlflow_conn_id

    @cached_property
    def mlflow_hook(self) -> MlflowHook:
        return MlflowHook(self.mlflow_conn_id)

    def execute(self, context: Any) -> dict[str, str]:
        from training import tracking

        ti = context["ti"]
        found = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
        states = {task: state for task, state in found.items() if task != self.task_id}
        status, tag = outcome(states)
        uri = self.mlflow_hook.stage_env().get("MLFLOW_TRACKING_URI")
        ended = tracking.end_pipeline_run(run_id_of(self.run_uri), status, {"posttrain.outcome": tag}, tracking_uri=uri)
        self.log.info("MLflow parent run %s ended %s (%s)", ended or "(none: no stage started)", status, tag)
        return {"mlflow_run_id": ended or "", "status": status, "outcome": tag}
