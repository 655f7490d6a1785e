"""nightly_retraining: RL rounds on top of the current champion with the newest task set.

Runs every night (POSTTRAIN_NIGHTLY_CRON, default 02:00 UTC) and whenever `taskset_refresh` publishes a new task
set. The champion (MLflow alias) becomes this run's `sft` stage (its policy init and KL reference) and the newest
task set its `taskset` stage; then the same rounds → evaluate → gate → promote as `post_training`, so a night that
makes things worse is blocked.
"""

from __future__ import annotations

from airflow.sdk import DAG, chain

from operators.pipeline import (
    DAG_DEFAULTS,
    MACROS,
    TASKSETS_ROOT,
    build_params,
    nightly_schedule,
    rounds_through_promotion,
    spec,
)
from operators.stage_operator import PosttrainStageOperator

RUN_URI = "{{ params.run_root }}/{{ run_slug(run_id) }}"
# The champion is the policy: no base model or profile to pick here. With a recipe (the `recipe` param, or
# POSTTRAIN_RECIPE for the scheduled nights) the presets are those of the recipe's base model, never the tiny
# profile's; without one, the tiny profile's, as for the demo.
NIGHTLY_PARAMS = {k: v for k, v in build_params().items() if k not in ("base_model", "profile")}

with DAG(
    dag_id="nightly_retraining",
    description="Nightly GRPO rounds from the champion on the newest task set, gated against the champion",
    schedule=nightly_schedule(),  # POSTTRAIN_NIGHTLY_CRON, default 02:00 UTC, and every new task set
    params=NIGHTLY_PARAMS,
    user_defined_macros=MACROS,
    max_active_runs=1,
    **DAG_DEFAULTS,
) as dag:
    taskset = PosttrainStageOperator(
        task_id="adopt_taskset", spec=spec("adopt", "--source", TASKSETS_ROOT, "--as", "taskset"), run_uri=RUN_URI
    )
    # the recipe's registered model (POSTTRAIN_MODEL_NAME without one)
    champion = PosttrainStageOperator(
        task_id="adopt_champion",
        spec=spec("adopt", "--as", "sft", "--prefix", "model", "--source"),
        stage_args=["models:/{{ model_name(params) }}@champion"],
        run_uri=RUN_URI,
    )
    chain([taskset, champion], rounds_through_promotion(RUN_URI))
