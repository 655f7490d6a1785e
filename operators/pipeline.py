"""What the DAG files share: the trigger form, stage configs built from it, run URIs, the gate branch.

Kept here, not in dags/, so DAG files stay pure wiring and this logic is unit-testable.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, BaseBranchOperator, Param

from operators.spec import StageSpec
from training.profiles import preset

MAX_ROUNDS = int(os.environ.get("POSTTRAIN_MAX_ROUNDS", "4"))
TASKSETS_ROOT = os.environ.get("POSTTRAIN_TASKSETS_ROOT", "s3://posttrain/tasksets")
MODEL_NAME = os.environ.get("POSTTRAIN_MODEL_NAME", "posttrain-tiny")
# Every stage resumes from its own checkpoints, so retrying is always safe.
DEFAULT_ARGS = {"retries": int(os.environ.get("POSTTRAIN_RETRIES", "2")),
                "retry_delay": timedelta(seconds=int(os.environ.get("POSTTRAIN_RETRY_DELAY_S", "30")))}
# What every posttrain DAG shares besides its schedule and params.
DAG_DEFAULTS: dict[str, Any] = {
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "default_args": DEFAULT_ARGS,
    "tags": ["posttrain"],
}
# Updated by taskset_refresh when it moves the pointer; nightly_retraining is scheduled on it.
TASKSET_ASSET = Asset(f"{TASKSETS_ROOT}/latest.json", extra={"kind": "posttrain task set"})
DEFAULT_RUN_ROOT = os.environ.get("POSTTRAIN_RUN_ROOT", "s3://posttrain/runs")
LAUNCHER = os.environ.get("POSTTRAIN_LAUNCHER", "local")
TRAIN_IMAGE = os.environ.get("POSTTRAIN_TRAIN_IMAGE", "posttrain-train:latest")

# The trigger form of `post_training` (Airflow renders these as a form in "Trigger DAG"). Knobs left empty
# (null) keep the stage's own default, so the form never silently overrides a tuned config.
PARAMS: dict[str, Param] = {
    "base_model": Param("", type="string", title="Base model",
                        description="hub id, local path or s3:// URI; empty = the tiny profile's model from scratch"),
    "profile": Param("tiny", enum=["tiny", "data"], title="Profile"),
    "mix": Param(None, type=["null", "object"], title="Domains and ratios",
                 description='train-set and RL prompt mix, e.g. {"math": 0.5, "code": 0.25, "extraction": 0.25}'),
    "rounds": Param(2, type="integer", minimum=0, maximum=MAX_ROUNDS, title="RL rounds"),
    "k": Param(None, type=["null", "integer"], minimum=2, maximum=64, title="Samples per prompt (k)"),
    "learning_rate": Param(None, type=["null", "number"], exclusiveMinimum=0, title="RL learning rate"),
    "kl_coef": Param(None, type=["null", "number"], minimum=0, title="KL coefficient (beta)"),
    "seed": Param(0, type="integer", title="Seed"),
    "run_root": Param(DEFAULT_RUN_ROOT, type="string", title="Run root URI",
                      description="outputs go to <run_root>/<run id>/<stage>/"),
    "stage_overrides": Param({}, type="object", title="Advanced: per-stage config",
                             description='merged into each stage\'s config last, e.g. {"sft": {"max_steps": 400}, '
                                         '"rl_round": {"steps": 80}} ("rl_round" applies to every round)'),
}


def run_slug(run_id: str) -> str:
    """An Airflow run id made safe for an object key (`manual__2026-12-03T08:00:00+00:00` has ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip("-")


def stage_config(stage: str, params: dict[str, Any]) -> str:
    """The inline JSON config of one stage from the trigger form's params (unset knobs are left out)."""
    seed = int(params.get("seed") or 0)
    if stage == "taskset":
        picked = {"profile": params.get("profile"), "mix": params.get("mix")}
    elif stage == "sft":
        picked = {"base_model": params.get("base_model") or None}
    elif stage.startswith("rl_round"):
        picked = {"samples_per_prompt": params.get("k"), "lr": params.get("learning_rate"),
                  "beta": params.get("kl_coef"), "domain_weights": params.get("mix")}
    else:
        picked = {}
    cfg = {"seed": seed, **{k: v for k, v in picked.items() if v is not None}} if stage in (
        "taskset", "sft", "evaluate") or stage.startswith("rl_round") else {}
    # A named base model gets the pretrained-model preset of its size; otherwise the profile's (tiny).
    cfg = {**preset(params.get("profile") or "tiny", stage, params.get("base_model") or ""), **cfg}
    overrides = params.get("stage_overrides") or {}
    if stage.startswith("rl_round"):
        cfg.update(overrides.get("rl_round") or {})
    cfg.update(overrides.get(stage) or {})
    return json.dumps(cfg, sort_keys=True)


# Processes per node for the stages that train (sft, rl-round): > 1 runs them under torchrun (DDP/FSDP).
NPROC_PER_NODE = int(os.environ.get("POSTTRAIN_NPROC_PER_NODE", "1"))
DISTRIBUTED_STAGES = ("sft", "rl-round")


def spec(command: str, *args: str, gpus: int = 0) -> StageSpec:
    nproc = NPROC_PER_NODE if command in DISTRIBUTED_STAGES else 1
    return StageSpec(command, tuple(args), launcher=LAUNCHER, image=TRAIN_IMAGE,
                     gpus=max(gpus, nproc) if LAUNCHER != "local" and gpus else 0, nproc_per_node=nproc)


class GateBranchOperator(BaseBranchOperator):
    """Follow `promote_task_id` when the gate's verdict is "promote", else `blocked_task_id`."""

    template_fields = ("gate_task_id",)

    def __init__(self, *, gate_task_id: str, promote_task_id: str, blocked_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id
        self.promote_task_id = promote_task_id
        self.blocked_task_id = blocked_task_id

    def choose_branch(self, context: Any) -> str:
        result = context["ti"].xcom_pull(task_ids=self.gate_task_id) or {}
        summary = result.get("summary", {})
        decision = summary.get("decision")
        if decision not in ("promote", "block"):
            raise ValueError(f"gate task {self.gate_task_id!r} returned no decision: {result!r}")
        for reason in summary.get("reasons", []):
            self.log.info("gate: %s", reason)
        return self.promote_task_id if decision == "promote" else self.blocked_task_id


def rounds_through_promotion(run_uri: str) -> Any:
    """The tail both training DAGs share, built inside the current DAG: RL rounds 1..MAX_ROUNDS (a round beyond
    `params.rounds` skips), evaluate, gate, and the branch to `promote` or `blocked`. Returns the first round,
    for the caller to put its own upstream stages in front of."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import chain

    from operators.stage_operator import PosttrainStageOperator

    rounds = [
        PosttrainStageOperator(
            task_id=f"rl_round_{n}", spec=spec("rl-round", "--round", str(n), gpus=1), run_uri=run_uri,
            config=f"{{{{ stage_config('rl_round_{n}', params) }}}}", enabled=f"{{{{ params.rounds >= {n} }}}}",
            pool="gpu")
        for n in range(1, MAX_ROUNDS + 1)
    ]
    evaluate = PosttrainStageOperator(
        task_id="evaluate", spec=spec("evaluate", gpus=1), run_uri=run_uri,
        config="{{ stage_config('evaluate', params) }}", pool="sandbox", trigger_rule="none_failed")
    gate = PosttrainStageOperator(task_id="gate", spec=spec("gate"), run_uri=run_uri,
                                  config="{{ stage_config('gate', params) }}")
    branch = GateBranchOperator(task_id="gate_verdict", gate_task_id="gate", promote_task_id="promote",
                                blocked_task_id="blocked")
    promote = PosttrainStageOperator(task_id="promote", spec=spec("promote"), run_uri=run_uri,
                                     config="{{ stage_config('promote', params) }}")
    blocked = EmptyOperator(task_id="blocked")
    chain(*rounds, evaluate, gate, branch, [promote, blocked])
    return rounds[0]
