"""A test-only DAG: post_training's approval → branch wiring (PromotionApproval, GateBranchOperator) on a planted
"promote" verdict and evaluation, with no training in front: the browser test clicks Reject under Required
Actions here, in seconds, instead of waiting for a whole pipeline run to reach its approval."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from operators.approval import PromotionApproval
from operators.pipeline import GateBranchOperator

with DAG("test_approval_flow", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    gate = PythonOperator(
        task_id="gate",
        python_callable=lambda: {"summary": {"decision": "promote", "reasons": ["planted for the approval test"]}},
    )
    evaluate = PythonOperator(
        task_id="evaluate",
        python_callable=lambda: {
            "summary": {"candidate_stage": "rl_round_1", "pass1": {"candidate": {"math": 0.5}, "sft": {"math": 0.25}}}
        },
    )
    approval = PromotionApproval(
        task_id="approval", gate_task_id="gate", evaluate_task_id="evaluate", require="true", timeout_hours=1
    )
    branch = GateBranchOperator(
        task_id="gate_verdict",
        gate_task_id="gate",
        promote_task_id="promote",
        blocked_task_id="blocked",
        approval_task_id="approval",
    )
    [gate, evaluate] >> approval >> branch >> [EmptyOperator(task_id="promote"), EmptyOperator(task_id="blocked")]
