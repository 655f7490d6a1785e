"""A test-only DAG: the promotion approval on a planted "promote" verdict, with a response deadline of about a
second, so nobody answers and the scheduler's timeout sweep applies the default answer (Reject)."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from operators.approval import PromotionApproval

with DAG("test_approval_timeout", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    gate = PythonOperator(
        task_id="gate",
        python_callable=lambda: {"summary": {"decision": "promote", "reasons": ["planted for the timeout test"]}},
    )
    evaluate = PythonOperator(task_id="evaluate", python_callable=lambda: {"summary": {}})
    approval = PromotionApproval(
        task_id="approval", gate_task_id="gate", evaluate_task_id="evaluate", require="true", timeout_hours=0.0003
    )
    [gate, evaluate] >> approval
