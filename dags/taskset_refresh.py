"""taskset_refresh: import new production feedback, build a fresh task set, move the shared `latest` pointer,
announce it as an Asset.

With a recipe that has a `feedback` section, `import_feedback` first stores every new file of its inbox as a
batch (`posttrain feedback import`; a file imported before is found and not written again), and the task set
reads all of the model line's batches. Without one the import is skipped.

The Asset event triggers `nightly_retraining` (which also runs on its own cron).
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from operators.pipeline import (
    DAG_DEFAULTS,
    TASKSET_ASSET,
    TASKSETS_ROOT,
    build_params,
    feedback,
    refresh_schedule,
    run_slug,
    spec,
    stage_config,
    stage_timeout,
)
from operators.stage_operator import PosttrainStageOperator

BUILD_URI = TASKSETS_ROOT + "/{{ run_slug(run_id) }}"

with DAG(
    dag_id="taskset_refresh",
    description="Rebuild the verifiable task set and publish it as the newest one",
    schedule=refresh_schedule(),  # POSTTRAIN_REFRESH_SCHEDULE, default @weekly
    # A recipe (or POSTTRAIN_RECIPE, for the weekly runs) names the sources; without one the tiny profile's
    # synthetic set is rebuilt, as for the demo.
    params={
        "recipe": build_params()["recipe"],
        "profile": Param("tiny", enum=["tiny", "data"]),
        "seed": Param(0, type="integer"),
    },
    user_defined_macros={
        "run_slug": run_slug,
        "stage_config": stage_config,
        "stage_timeout": stage_timeout,
        "feedback": feedback,
    },
    **DAG_DEFAULTS,
) as dag:
    imported = PosttrainStageOperator(
        task_id="import_feedback",
        spec=spec("feedback", "import"),
        stage_args=[
            "{{ feedback(params).inbox }}",
            "--to",
            "{{ feedback(params).root }}",
            "--domain={{ feedback(params).domain }}",
            "--verifier={{ feedback(params).verifier }}",
        ],
        run_uri="",
        enabled="{{ feedback(params).inbox }}",
    )
    build = PosttrainStageOperator(
        task_id="build_taskset",
        spec=spec("build-taskset"),
        # refused when the holdout would be drawn differently from the newest task set's (a changed salt or
        # fraction), unless the recipe says new_holdout: the champion's training tasks stay out of the holdout
        stage_args=["--set", f"previous={TASKSETS_ROOT}"],
        run_uri=BUILD_URI,
        config="{{ stage_config('taskset', params) }}",
        timeout="{{ stage_timeout('taskset', params) }}",
        trigger_rule="none_failed",  # a skipped import (no feedback configured) still builds
    )
    publish = PosttrainStageOperator(
        task_id="publish",
        spec=spec("latest", TASKSETS_ROOT, "--set"),
        stage_args=[BUILD_URI + "/taskset"],
        run_uri="",
        outlets=[TASKSET_ASSET],
    )
    imported >> build >> publish
