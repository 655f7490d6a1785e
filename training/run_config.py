"""Stage configs from a run's parameters: the trigger form's (operators/form.py) or a recipe's
(training/recipes.py), the one place both the DAGs (operators/pipeline.py) and the CLI (`--recipe`) build them,
so the same parameters give the same stage configs from a shell and from Airflow.

Torch-free: the scheduler imports it to render the DAGs' templates.
"""

from __future__ import annotations

from typing import Any

from training.profiles import apply_preset, deep_merge

# The parameters stage_config reads: with a recipe, the recipe's replace the form's (operators/pipeline.py).
STAGE_KNOBS = (
    "seed", "profile", "mix", "base_model", "preset_tier", "model_name", "rounds", "k", "learning_rate", "kl_coef",
    "advantage", "policy_loss", "loss_agg", "rollout_engine", "gate_metrics", "noninferiority_margin", "max_kl",
    "min_entropy_ratio",
)  # fmt: skip


def stage_config(stage: str, params: dict[str, Any]) -> dict[str, Any]:
    """The config of one stage ("taskset", "sft", "rl_round_N", "evaluate", "gate", "promote") from `params`:
    the knobs the params set (unset ones are left out), over the stage's preset (the pretrained tier of
    `base_model`, else the profile's), under the per-stage overrides (`stage_overrides`; "rl_round" applies to
    every round)."""
    seed = int(params.get("seed") or 0)
    if stage == "taskset":
        picked = {"profile": params.get("profile"), "mix": params.get("mix")}
    elif stage == "sft":
        picked = {"base_model": params.get("base_model") or None}
    elif stage.startswith("rl_round"):
        picked = {
            "samples_per_prompt": params.get("k"),
            "lr": params.get("learning_rate"),
            "beta": params.get("kl_coef"),
            "domain_weights": params.get("mix"),
            "advantage": params.get("advantage"),
            "policy_loss": params.get("policy_loss"),
            "loss_agg": params.get("loss_agg"),
            "rollout_engine": params.get("rollout_engine"),
        }
    elif stage == "gate":
        picked = {
            "metrics": params.get("gate_metrics"),
            "noninferiority_margin": params.get("noninferiority_margin"),
            "max_kl": params.get("max_kl"),
            "min_entropy_ratio": params.get("min_entropy_ratio"),
        }
    elif stage in ("evaluate", "promote"):
        picked = {"model_name": params.get("model_name") or None}
    else:
        picked = {}
    chosen = {k: v for k, v in picked.items() if v is not None}
    cfg = (
        {"seed": seed, **chosen} if stage in ("taskset", "sft", "evaluate") or stage.startswith("rl_round") else chosen
    )
    # A named base model gets the pretrained-model preset of its size; otherwise the profile's (tiny).
    cfg = apply_preset(
        stage, cfg, params.get("base_model") or "", params.get("profile") or "tiny", params.get("preset_tier") or ""
    )
    overrides = params.get("stage_overrides") or {}
    # sub-configs merge: {"lora": {"r": 8}} keeps the preset's lora.enabled, as the CLI's --set lora.r=8 does
    if stage.startswith("rl_round"):
        cfg = deep_merge(cfg, overrides.get("rl_round") or {})
    return deep_merge(cfg, overrides.get(stage) or {})
