"""What the DAG files share: stage configs built from the trigger form (operators/form.py), run URIs, the gate
branch, the approval before promotion and the end of the MLflow parent run.

Kept here, not in dags/, so DAG files stay pure wiring and this logic is unit-testable.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, BaseBranchOperator
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from operators.form import DEFAULT_RUN_ROOT, MAX_ROUNDS, PARAMS, build_params
from operators.queues import QUEUES
from operators.spec import StageSpec
from training import recipes, run_config
from training.profiles import deep_merge

__all__ = ["DEFAULT_RUN_ROOT", "MAX_ROUNDS", "PARAMS", "build_params"]  # the form lives in operators/form.py
TASKSETS_ROOT = os.environ.get("POSTTRAIN_TASKSETS_ROOT", "s3://posttrain/tasksets")
MODEL_NAME = os.environ.get("POSTTRAIN_MODEL_NAME", "posttrain-tiny")
# When the loop runs by the clock, per deployment: nightly_retraining's cron (UTC; it also runs on every new task
# set) and taskset_refresh's schedule. "off" leaves only the task-set event (nightly) or manual and external
# triggers (refresh). With catchup off, Airflow runs a clocked DAG once for its latest tick when it is unpaused.
NIGHTLY_CRON = os.environ.get("POSTTRAIN_NIGHTLY_CRON", "0 2 * * *").strip()
REFRESH_SCHEDULE = os.environ.get("POSTTRAIN_REFRESH_SCHEDULE", "@weekly").strip()
# Every stage resumes from its own checkpoints, and a stage lease keeps a retry from writing beside an attempt
# that lives on, so retrying is always safe. 10 s between tries (was 30 s) puts a crashed stage back to work
# within about a minute of the crash; the cost is that 2 retries ride out only ~20 s of a storage or MLflow
# outage (raise POSTTRAIN_RETRY_DELAY_S where outages last longer).
DEFAULT_ARGS = {
    "retries": int(os.environ.get("POSTTRAIN_RETRIES", "2")),
    "retry_delay": timedelta(seconds=int(os.environ.get("POSTTRAIN_RETRY_DELAY_S", "10"))),
}
# What every posttrain DAG shares besides its schedule and params.
DAG_DEFAULTS: dict[str, Any] = {
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "default_args": DEFAULT_ARGS,
    "tags": ["posttrain"],
}
# Updated by taskset_refresh when it moves the pointer; nightly_retraining is scheduled on it.
TASKSET_ASSET = Asset(f"{TASKSETS_ROOT}/latest.json", extra={"kind": "posttrain task set"})
LAUNCHER = os.environ.get("POSTTRAIN_LAUNCHER", "local")
TRAIN_IMAGE = os.environ.get("POSTTRAIN_TRAIN_IMAGE", "posttrain-train:latest")


def nightly_schedule(cron: str = NIGHTLY_CRON) -> Any:
    """nightly_retraining's schedule: the cron or a new task set, whichever comes first; the event alone when the
    cron is "off"."""
    if cron.lower() in ("", "off", "none"):
        return TASKSET_ASSET
    # The core timetable is annotated with scheduler-side SerializedAsset, but its __init__ converts SDK assets
    # (ensure_serialized_asset: "so this class works in dag files"), so an SDK Asset is right at runtime.
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=TASKSET_ASSET)  # type: ignore[arg-type]


def refresh_schedule(schedule: str = REFRESH_SCHEDULE) -> str | None:
    """taskset_refresh's schedule (a cron or preset such as "@weekly"); None, manual runs only, when "off"."""
    return None if schedule.lower() in ("", "off", "none") else schedule


def run_slug(run_id: str) -> str:
    """An Airflow run id made safe for an object key (`manual__2026-12-03T08:00:00+00:00` has ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-")


def stage_config(stage: str, params: dict[str, Any]) -> str:
    """The inline JSON config of one stage from the DAG run's params: a named recipe's parameters
    (training/recipes.py) when `params.recipe` is set, else the trigger form's; built by
    training/run_config.py, as the CLI builds it."""
    return json.dumps(run_config.stage_config(stage, run_params(params)), sort_keys=True)


def run_params(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters stage configs are built from. With a recipe, the recipe decides what to train (model,
    data, presets, rounds) and the form only adds its per-stage overrides on top; the run's controls
    (run_root, approval) stay the form's."""
    name = params.get("recipe")
    if not name:
        return params
    from_recipe = recipes.recipe_params(recipes.load_recipe(name))
    extra = params.get("stage_overrides") or {}
    merged = {k: deep_merge(from_recipe["stage_overrides"].get(k, {}), v) for k, v in extra.items()}
    controls = {k: v for k, v in params.items() if k not in run_config.STAGE_KNOBS}
    return {**controls, **from_recipe, "stage_overrides": {**from_recipe["stage_overrides"], **merged}}


def model_name(params: dict[str, Any]) -> str:
    """The registered model a run trains: its recipe's, else POSTTRAIN_MODEL_NAME."""
    return str(run_params(params).get("model_name") or MODEL_NAME)


def rounds(params: dict[str, Any]) -> int:
    """How many RL rounds the run has: its recipe's, else the form's."""
    return int(run_params(params).get("rounds") or 0)


def feedback(params: dict[str, Any]) -> dict[str, str]:
    """The run's feedback inbox, batch root, default domain and verifier (its recipe's `feedback`); all ""
    without one, which skips taskset_refresh's import."""
    found = run_params(params).get("feedback") or {}
    return {k: str(found.get(k) or "") for k in ("inbox", "root", "domain", "verifier")}


def stage_timeout(stage: str, params: dict[str, Any]) -> str:
    """The stage's wall-clock limit in seconds from its recipe's `timeouts` (`rl_round_N`, else `rl_round` for a
    round), as the string the operator's templated `timeout` takes; "" keeps the StageSpec's."""
    found = run_params(params).get("timeouts") or {}
    value = found.get(stage)
    if value is None and stage.startswith("rl_round_"):
        value = found.get("rl_round")
    return "" if value is None else str(recipes.duration_s(value))


def promote_config(params: dict[str, Any], approval: dict[str, Any] | None) -> str:
    """The promote stage's config: the form's, plus who approved the candidate and when (as version tags)."""
    from operators.approval import approval_tags

    cfg = json.loads(stage_config("promote", params))
    tags = approval_tags(approval)
    if tags:
        cfg["version_tags"] = {**cfg.get("version_tags", {}), **tags}
    return json.dumps(cfg, sort_keys=True)


# The Jinja macros every training DAG's templates use.
MACROS: dict[str, Any] = {
    "run_slug": run_slug,
    "stage_config": stage_config,
    "promote_config": promote_config,
    "stage_timeout": stage_timeout,
    "model_name": model_name,
    "rounds": rounds,
    "feedback": feedback,
}


# Processes per node for the stages that train (sft, rl-round): > 1 runs them under torchrun (DDP/FSDP).
NPROC_PER_NODE = int(os.environ.get("POSTTRAIN_NPROC_PER_NODE", "1"))
DISTRIBUTED_STAGES = ("sft", "rl-round")
# Restarts of a torchrun stage whose rank failed, before the task fails: in place, from the last checkpoint,
# without Airflow rescheduling the task (a lost rank on a busy GPU pool would otherwise wait for a slot again).
MAX_RESTARTS = int(os.environ.get("POSTTRAIN_MAX_RESTARTS", "2"))


def spec(command: str, *args: str, gpus: int = 0) -> StageSpec:
    nproc = NPROC_PER_NODE if command in DISTRIBUTED_STAGES else 1
    return StageSpec(
        command,
        tuple(args),
        launcher=LAUNCHER,
        image=TRAIN_IMAGE,
        gpus=max(gpus, nproc) if LAUNCHER != "local" and gpus else 0,
        nproc_per_node=nproc,
        max_restarts=MAX_RESTARTS if nproc > 1 else 0,
    )


class GateBranchOperator(BaseBranchOperator):
    """Follow `promote_task_id` when the gate's verdict is "promote" (and, with `approval_task_id`, a person
    asked to approve it did), else `blocked_task_id`."""

    template_fields = ("gate_task_id",)

    def __init__(
        self,
        *,
        gate_task_id: str,
        promote_task_id: str,
        blocked_task_id: str,
        approval_task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id
        self.promote_task_id = promote_task_id
        self.blocked_task_id = blocked_task_id
        self.approval_task_id = approval_task_id

    def choose_branch(self, context: Any) -> str:
        result = context["ti"].xcom_pull(task_ids=self.gate_task_id) or {}
        summary = result.get("summary", {})
        decision = summary.get("decision")
        if decision not in ("promote", "block"):
            raise ValueError(f"gate task {self.gate_task_id!r} returned no decision: {result!r}")
        for reason in summary.get("reasons", []):
            self.log.info("gate: %s", reason)
        if decision != "promote":
            return self.blocked_task_id
        approval = context["ti"].xcom_pull(task_ids=self.approval_task_id) if self.approval_task_id else None
        if approval and approval.get("asked") and not approval.get("approved"):
            self.log.info("the gate said promote, but %s rejected it at %s", approval.get("by"), approval.get("at"))
            return self.blocked_task_id
        return self.promote_task_id


def rounds_through_promotion(run_uri: str) -> Any:
    """The tail both training DAGs share, built inside the current DAG: RL rounds 1..MAX_ROUNDS (a round beyond
    `params.rounds` skips), evaluate, gate, the approval (asked only with `params.require_approval`), the branch
    to `promote` or `blocked`, and `end_tracking` (a teardown that ends the MLflow parent run FINISHED or
    FAILED with the DAG run). Returns the first round, for the caller to put its own upstream stages in front
    of. The DAG's templates need MACROS."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import chain

    from operators.approval import PromotionApproval
    from operators.end_tracking import EndTrackingOperator
    from operators.stage_operator import PosttrainStageOperator

    rounds = [
        PosttrainStageOperator(
            task_id=f"rl_round_{n}",
            spec=spec("rl-round", "--round", str(n), gpus=1),
            run_uri=run_uri,
            config=f"{{{{ stage_config('rl_round_{n}', params) }}}}",
            timeout=f"{{{{ stage_timeout('rl_round_{n}', params) }}}}",
            enabled=f"{{{{ rounds(params) >= {n} }}}}",
            pool="gpu",
        )
        for n in range(1, MAX_ROUNDS + 1)
    ]
    evaluate = PosttrainStageOperator(
        task_id="evaluate",
        spec=spec("evaluate", gpus=1),
        run_uri=run_uri,
        config="{{ stage_config('evaluate', params) }}",
        timeout="{{ stage_timeout('evaluate', params) }}",
        pool="sandbox",
        trigger_rule="none_failed",
    )
    gate = PosttrainStageOperator(
        task_id="gate",
        spec=spec("gate"),
        run_uri=run_uri,
        config="{{ stage_config('gate', params) }}",
        timeout="{{ stage_timeout('gate', params) }}",
    )
    # Stage tasks take their queue from their stage (operators/queues.py); the control tasks are cpu work.
    approval = PromotionApproval(
        task_id="approval",
        queue=QUEUES.cpu,
        gate_task_id="gate",
        evaluate_task_id="evaluate",
        require="{{ params.require_approval | default(false) }}",
        timeout_hours="{{ params.approval_timeout_hours | default(24) }}",
    )
    branch = GateBranchOperator(
        task_id="gate_verdict",
        queue=QUEUES.cpu,
        gate_task_id="gate",
        promote_task_id="promote",
        blocked_task_id="blocked",
        approval_task_id="approval",
    )
    promote = PosttrainStageOperator(
        task_id="promote",
        spec=spec("promote"),
        run_uri=run_uri,
        config="{{ promote_config(params, ti.xcom_pull(task_ids='approval')) }}",
        timeout="{{ stage_timeout('promote', params) }}",
    )
    blocked = EmptyOperator(task_id="blocked", queue=QUEUES.cpu)
    end = EndTrackingOperator(task_id="end_tracking", run_uri=run_uri, queue=QUEUES.cpu).as_teardown()
    chain(*rounds, evaluate, gate, approval, branch, [promote, blocked])
    [promote, blocked] >> end
    return rounds[0]
