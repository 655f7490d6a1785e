"""A test-only DAG: the real gate → branch → promote wiring of post_training, on a planted evaluation."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from operators.pipeline import GateBranchOperator, spec
from operators.stage_operator import PosttrainStageOperator

with DAG("test_gate_flow", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    uri = "{{ dag_run.conf['run_uri'] }}"
    gate = PosttrainStageOperator(task_id="gate", spec=spec("gate"), run_uri=uri)
    branch = GateBranchOperator(
        task_id="gate_verdict", gate_task_id="gate", promote_task_id="promote", blocked_task_id="blocked"
    )
    promote = PosttrainStageOperator(
        task_id="promote", spec=spec("promote"), run_uri=uri, config="{{ dag_run.conf['promote_config'] }}"
    )
    blocked = EmptyOperator(task_id="blocked")
    gate >> branch >> [promote, blocked]
