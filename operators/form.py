"""The trigger form of the training DAGs: every field, its section, its help and its validation.

Airflow renders these Params as the "Trigger DAG" form: `section` groups fields, `values_display` gives a
dropdown readable labels, `description_md` is the help under a field, and the JSON-schema keywords (`minimum`,
`enum`, `pattern`, ...) are checked by the UI as the user types and by the API on submit. Every default is
valid, so the form opens valid and submits as it opens (the tiny profile, built from scratch).

Knobs whose default is null keep the stage's own (or the profile's tuned) value, so the form never silently
overrides a tuned config. The algorithm names are listed here rather than imported from training.rl.algorithms,
which imports torch (this module is loaded by the scheduler); tests/operators/test_form.py checks they match the
registries. The rollout engines come from training.rollout.ENGINES, which is torch-free.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import Param

from training.evaluation.gate_config import METRIC_LABELS
from training.profiles import PROFILES
from training.rollout import ENGINES

# RL rounds the DAGs are built with; a run asks for 0..MAX_ROUNDS of them (a round beyond it skips).
MAX_ROUNDS = int(os.environ.get("POSTTRAIN_MAX_ROUNDS", "8"))
DEFAULT_RUN_ROOT = os.environ.get("POSTTRAIN_RUN_ROOT", "s3://posttrain/runs")

SECTION_DATA = "Data"
SECTION_SFT = "Supervised fine-tuning (SFT)"
SECTION_RL = "Reinforcement learning (GRPO rounds)"
SECTION_GATE = "Evaluation and gate"
SECTION_ADVANCED = "Advanced"

PROFILE_LABELS = {
    "tiny": "tiny: ~0.5M-parameter GPT-2 built from scratch, synthetic tasks, CPU in minutes",
    "data": "data: your base model and task data, stage defaults (no tuned preset)",
}
# Mirrors of training.rl.algorithms' registries (ADVANTAGES, LOSS_AGGREGATIONS); a test keeps them equal.
ADVANTAGE_LABELS = {
    "grpo": "GRPO: centred on the group mean, divided by the group's reward std",
    "dr_grpo": "Dr. GRPO: centred on the group mean only (no std division)",
    "rloo": "RLOO: minus the mean of the group's other samples",
    "reinforce_pp": "REINFORCE++: centred on the group mean, divided by the whole step's std",
}
POLICY_LOSS_LABELS = {
    "clip": "PPO clip: each token's ratio clipped (GRPO, DAPO)",
    "gspo": "GSPO: one ratio per sequence, clipped per sequence (set the clip range to 3e-4 / 4e-4)",
    "cispo": "CISPO: the clipped ratio weighs log p, no token leaves the gradient",
}
LOSS_AGG_LABELS = {
    "token-mean": "token mean (DAPO: every token weighs the same)",
    "seq-mean-token-mean": "sequence mean of token means (original GRPO)",
    "seq-mean-token-sum": "sequence mean of token sums",
}
ENGINE_LABELS = {
    "auto": "auto: vLLM on a GPU where it is installed, else transformers",
    **{name: f"{name}: {what}" for name, what in ENGINES.items()},
}
# The dimensions the gate can compare (gate_rules is torch-free, so the scheduler may import it).
GATE_METRICS = METRIC_LABELS
# The built-in domains; a task set may have others (a verifier from a user's package, rows naming their own
# domain), so the form accepts any domain name and the stages check it against the task set in use.
DOMAINS = ("math", "code", "extraction", "instruction")
DOMAIN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Stage names a per-stage override may address ("rl_round" applies to every round).
OVERRIDE_STAGES = (
    "taskset",
    "sft",
    "rl_round",
    *(f"rl_round_{n}" for n in range(1, MAX_ROUNDS + 1)),
    "evaluate",
    "gate",
    "promote",
)


def _mix_schema() -> dict[str, Any]:
    return {
        "propertyNames": {"pattern": DOMAIN_NAME},
        "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
    }


def build_params(max_rounds: int = MAX_ROUNDS) -> dict[str, Param]:
    """The form's fields, in the order the form shows them (each section in its first field's place)."""
    return {
        # ----- data ------------------------------------------------------------------------------------------
        "recipe": Param(
            # scheduled runs have no form: POSTTRAIN_RECIPE is the model line they train
            os.environ.get("POSTTRAIN_RECIPE") or None,
            type=["null", "string"],
            maxLength=500,
            pattern=r"^\S*$",
            title="Recipe",
            section=SECTION_DATA,
            description_md="A recipe of your model line (a name in the recipes folder, or a path; "
            "`training/recipes.py`): model, base model, data per domain, rounds and per-stage settings. When set "
            "it decides what is trained, and the fields below only add per-stage overrides. Empty: the fields.",
        ),
        "profile": Param(
            "tiny",
            type="string",
            enum=list(PROFILES),
            values_display=PROFILE_LABELS,
            title="Profile",
            section=SECTION_DATA,
            description_md="Per-stage presets. **tiny** runs the whole pipeline on CPU in minutes; **data** uses "
            "the stage defaults, for your own base model and task data.",
        ),
        "mix": Param(
            None,
            type=["null", "object"],
            title="Domains and ratios",
            section=SECTION_DATA,
            **_mix_schema(),
            description_md="Train-set and RL prompt mix as ratios between 0 and 1 per domain: the built-in "
            "`math`, `code`, `extraction`, `instruction`, or the domains of your task set, e.g. "
            '`{"math": 0.5, "code": 0.25, "extraction": 0.25}`. Empty: the profile\'s mix.',
        ),
        "seed": Param(
            0,
            type="integer",
            minimum=0,
            maximum=2**31 - 1,
            title="Seed",
            section=SECTION_DATA,
            description_md="Seeds the task set, SFT and every RL step: the same seed gives the same run.",
        ),
        # ----- SFT -------------------------------------------------------------------------------------------
        "base_model": Param(
            None,
            type=["null", "string"],
            maxLength=500,
            pattern=r"^\S*$",
            title="Base model",
            section=SECTION_SFT,
            description_md="Hugging Face hub id, local path or `s3://` URI of the model to post-train (no "
            "spaces). **Empty: the profile's model, built from scratch** (tiny).",
        ),
        # ----- RL --------------------------------------------------------------------------------------------
        "rounds": Param(
            2,
            type="integer",
            minimum=0,
            maximum=max_rounds,
            title="RL rounds",
            section=SECTION_RL,
            description_md=f"GRPO rounds after SFT, 0 to {max_rounds}. Each round starts from the previous "
            "one and is evaluated on the holdout at its end.",
        ),
        "k": Param(
            None,
            type=["null", "integer"],
            minimum=2,
            maximum=64,
            title="Samples per prompt (k)",
            section=SECTION_RL,
            description_md="Completions sampled per prompt, the GRPO group size (2 to 64). Empty: the profile's.",
        ),
        "learning_rate": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            maximum=1,
            title="RL learning rate",
            section=SECTION_RL,
            description_md="AdamW learning rate of the RL rounds, above 0 and at most 1 (tiny: `2e-4`). "
            "Empty: the profile's.",
        ),
        "kl_coef": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=10,
            title="KL coefficient (beta)",
            section=SECTION_RL,
            description_md="Weight of the KL penalty to the SFT model, 0 to 10; 0 turns it off. Empty: the profile's.",
        ),
        "advantage": Param(
            "grpo",
            type="string",
            enum=list(ADVANTAGE_LABELS),
            values_display=ADVANTAGE_LABELS,
            title="Advantage estimator",
            section=SECTION_RL,
            description_md="How a completion's reward becomes its advantage within its group.",
        ),
        "policy_loss": Param(
            "clip",
            type="string",
            enum=list(POLICY_LOSS_LABELS),
            values_display=POLICY_LOSS_LABELS,
            title="Policy loss",
            section=SECTION_RL,
            description_md="The policy-gradient objective each completion's advantage enters. GSPO's clip range is "
            "set per stage (`stage_overrides`: `rl_round: {clip_low: 3e-4, clip_high: 4e-4}`).",
        ),
        "loss_agg": Param(
            "token-mean",
            type="string",
            enum=list(LOSS_AGG_LABELS),
            values_display=LOSS_AGG_LABELS,
            title="Loss aggregation",
            section=SECTION_RL,
            description_md="How per-token policy losses are averaged into the batch loss.",
        ),
        "rollout_engine": Param(
            # "auto", the presets' own choice: a default of "hf" here overrode it, so a real model triggered
            # from the unchanged form never rolled out with vLLM
            "auto",
            type="string",
            enum=list(ENGINE_LABELS),
            values_display=ENGINE_LABELS,
            title="Rollout engine",
            section=SECTION_RL,
            description_md="What samples the completions. `auto`: vLLM on a GPU worker where it is installed "
            "(the `gpu` extra), else transformers.",
        ),
        # ----- evaluation and gate ---------------------------------------------------------------------------
        "require_approval": Param(
            False,
            type="boolean",
            title="Require human approval",
            section=SECTION_GATE,
            description_md="When the gate says promote, wait for a person to **Approve** or **Reject** under "
            "*Required Actions* (the verdict and the evaluation table are shown there). "
            "Reject, or no answer in time, blocks the promotion.",
        ),
        "approval_timeout_hours": Param(
            24,
            type="number",
            exclusiveMinimum=0,
            maximum=24 * 14,
            title="Approval timeout (hours)",
            section=SECTION_GATE,
            description_md="How long the approval waits (above 0, at most 14 days); then it counts as a reject.",
        ),
        "gate_metrics": Param(
            None,
            type=["null", "array"],
            items={"type": "string", "enum": list(GATE_METRICS)},
            uniqueItems=True,
            title="Gated dimensions",
            section=SECTION_GATE,
            description_md="Which evaluation dimensions block a credible drop against the champion and the SFT "
            "model, per domain: "
            + ", ".join(f"`{k}` ({v})" for k, v in GATE_METRICS.items())
            + '. Empty: the gate\'s default, `["pass1", "format"]`.',
        ),
        "noninferiority_margin": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=0.5,
            title="Non-inferiority margin",
            section=SECTION_GATE,
            description_md="Largest pass@1 loss per domain (a fraction: `0.03` = 3 points) the candidate must "
            "*show* it stays within, one-sided at 95%, Holm-corrected across domains. Too little "
            "evidence blocks, so it needs large holdouts. 0 or empty: off.",
        ),
        "max_kl": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=100,
            title="Max KL to the reference",
            section=SECTION_GATE,
            description_md="Block when the last RL round's mean per-token KL to the reference model exceeds this "
            "(nats). 0 or empty: off.",
        ),
        "min_entropy_ratio": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=1,
            title="Min entropy ratio",
            section=SECTION_GATE,
            description_md="Block when the last RL round's mean token entropy falls below this share of the first "
            "round's (a collapsed policy), between 0 and 1. 0 or empty: off.",
        ),
        # ----- advanced --------------------------------------------------------------------------------------
        "run_root": Param(
            DEFAULT_RUN_ROOT,
            type="string",
            pattern=r"^(s3|file)://\S+$",
            title="Run root URI",
            section=SECTION_ADVANCED,
            description_md="Outputs go to `<run root>/<run id>/<stage>/`: an `s3://bucket/prefix` or "
            "`file:///path` URI.",
        ),
        "stage_overrides": Param(
            {},
            type="object",
            title="Per-stage config",
            section=SECTION_ADVANCED,
            propertyNames={"enum": list(OVERRIDE_STAGES)},
            additionalProperties={"type": "object"},
            description_md='Merged into each stage\'s config last, e.g. `{"sft": {"max_steps": 400}, '
            '"rl_round": {"steps": 80}}`. Keys: `taskset`, `sft`, `rl_round` (every round), '
            "`rl_round_N`, `evaluate`, `gate`, `promote`; `posttrain <stage> --help` lists each "
            "stage's knobs.",
        ),
    }


# The form as the tests and docs read it. A DAG builds its own with build_params(): Airflow resolves a run's conf
# into the DAG's Param objects in place (ParamsDict.update -> Param.resolve), so DAGs sharing these objects in one
# process (dag.test, a DagBag parsed twice) would hand one run's values to the next as its defaults.
PARAMS: dict[str, Param] = build_params()
