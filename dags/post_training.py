"""post_training: task set -> SFT -> RL rounds -> evaluate -> gate -> promote (or report the block).

Trigger it from the UI with the form (operators/form.py: data, SFT, RL, evaluation and gate, advanced); with
"Require human approval" a person approves the promotion under Required Actions.
Every task runs one `posttrain <stage>` under the same run URI; a retry resumes the stage from its checkpoints.
"""

from __future__ import annotations

from airflow.sdk import DAG, chain

from operators.pipeline import DAG_DEFAULTS, MACROS, build_params, rounds_through_promotion, spec
from operators.stage_operator import PosttrainStageOperator

RUN_URI = "{{ params.run_root }}/{{ run_slug(run_id) }}"

with DAG(
    dag_id="post_training",
    description="Post-train a base model: verifiable tasks, SFT, GRPO rounds, evaluation, regression gate",
    schedule=None,
    params=build_params(),
    user_defined_macros=MACROS,
    max_active_runs=1,
    **DAG_DEFAULTS,
) as dag:
    taskset = PosttrainStageOperator(
        task_id="build_taskset",
        spec=spec("build-taskset"),
        run_uri=RUN_URI,
        config="{{ stage_config('taskset', params) }}",
        timeout="{{ stage_timeout('taskset', params) }}",
        pool="default_pool",
    )
    sft = PosttrainStageOperator(
        task_id="sft",
        spec=spec("sft", gpus=1),
        run_uri=RUN_URI,
        config="{{ stage_config('sft', params) }}",
        timeout="{{ stage_timeout('sft', params) }}",
        pool="gpu",
    )
    chain(taskset, sft, rounds_through_promotion(RUN_URI))
