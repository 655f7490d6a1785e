"""Named per-stage config presets, and the presets for pretrained chat models (by size). The stage dataclasses
keep generic defaults; a preset is what a pipeline run passes to each stage (the DAG's trigger form layers the
user's overrides on top).

`tiny` is tuned on 2 CPU cores for measurement: every domain has headroom, so each evaluation dimension can
move, and SFT then 2 GRPO rounds lift several domains (tests/training/stages/test_tiny_pipeline.py asserts >= 2 domains
up by >= 10 points, none credibly down by the gate's regression rule). Its choices, and why:
- per-domain difficulty levels (math 1-2, code 4-5, extraction 3-4, instruction 1-4). Code level 5's prompts have
  two readings that only the tests settle, so a first attempt fails about half the time and the visible test's
  failure names the fix: the headroom multi-turn RL and self-repair need (benchmarks/multiturn.py);
- a math-heavy mix, and 10% extra SFT examples behind long-context distractors;
- SFT stopped at 450 steps at constant LR, short of converged, so RL has headroom (fewer steps left math below
  the 20-80% band every baseline should sit in);
- a low RL learning rate (higher ones collapsed the holdout) and 150 steps per round, with prompts weighted
  towards math and code;
- single-turn rounds: the multi-turn recipe of benchmarks/multiturn.py teaches repair but has cost some seeds'
  code first attempts.
`python benchmarks/tiny_dimensions.py` measures every dimension per seed; its figures, and the per-level reading
of each domain's change, are in docs/results.md.
"""

from __future__ import annotations

import json
from typing import Any

from training.model_size import model_size_b

TINY: dict[str, dict[str, Any]] = {
    "taskset": {
        "counts": {"math": 3000, "code": 600, "extraction": 400, "instruction": 400},
        "difficulties": [1, 2],
        "domain_difficulties": {"code": [4, 5], "extraction": [3, 4], "instruction": [1, 2, 3, 4]},
        "mix": {"math": 0.65, "code": 0.15, "extraction": 0.1, "instruction": 0.1},
        "mix_tolerance": 0.1,
    },
    "sft": {
        "max_steps": 450,
        "min_lr_ratio": 1.0,
        "checkpoint_every": 100,
        "long_context_share": 0.1,
        # the full (tokens, V) log-softmax, as when the lift figures were measured: at V = 512 the logits are
        # small, and the chunked head's different float rounding moves the tiny run's figures (as below)
        "logprob_chunk_tokens": 0,
        # the dense block mask, likewise: attention by segments takes another SDPA kernel (other rounding)
        "packed_attention": "dense",
        # torch's per-parameter AdamW loop, likewise: the fused kernel rounds differently, and with it the lift
        # test's run lifted math by 22 points and extraction by exactly 10, nothing else (docs/results.md)
        "fused_optimizer": False,
    },
    "rl_round": {
        "steps": 150,
        "checkpoint_every": 25,
        "lr": 2e-4,
        "prompts_per_step": 32,
        "samples_per_prompt": 8,
        "beta": 0.01,
        # every micro-batch packed, as when the lift test's figures were measured (choosing the
        # cheaper layout changes the update's float rounding, and the tiny run is sensitive to it)
        "pack_where_cheaper": False,
        "logprob_chunk_tokens": 0,
        "packed_attention": "dense",
        "fused_optimizer": False,
        "domain_weights": {"math": 0.5, "code": 0.3, "extraction": 0.1, "instruction": 0.1},
    },
    "evaluate": {"max_tasks_per_domain": 200},
}

PROFILES: dict[str, dict[str, dict[str, Any]]] = {"tiny": TINY, "data": {}}

# ----- pretrained chat models ---------------------------------------------------------------------------------
# Chosen when a run names a `base_model`, by the model's size (read from its name, e.g. "Qwen2.5-0.5B-Instruct";
# a name without a size gets the smallest tier). Each value's source:
#   [TRL-SFT]   TRL 1.16 SFTConfig defaults: learning_rate 2e-5, max_length 1024.
#   [Tulu3]     open-instruct, Tulu 3 8B SFT: learning rate 5e-6 (full fine-tuning at 8B).
#   [QLoRA]     Dettmers et al. 2023: LoRA on all linear layers, learning rate 2e-4 at 7B, r 16 / alpha 32 range.
#   [TRL-GRPO]  TRL 1.16 GRPOConfig defaults: learning_rate 1e-6, num_generations 8, max_completion_length 512,
#               temperature 1.0.
#   [DSMath]    DeepSeekMath (Shao et al. 2024) GRPO: policy learning rate 1e-6.
#   [verl]      verl's GSM8K GRPO examples: kl_loss_coef 0.001 (low-variance k3 KL), max_response_length 1024.
#   [LoRA-RL]   "LoRA Without Regret" (Schulman et al., Thinking Machines 2025): LoRA's best learning rate is
#               about 10x full fine-tuning's, and RL works even at low rank.
# Full fine-tuning of an 8B model's SFT or RL does not fit one 80 GB GPU with fp32 AdamW state (about 16 bytes
# a parameter: 128 GB), so the 8B tier uses LoRA.
# Chat instructions come from each domain's verifier (`Verifier.instruction`: math's \boxed{}, code's fenced
# block, a user's own), resolved by SFT and saved with the model (ChatSettings.from_verifiers).
# Reasoning lengths. Chains of thought run to thousands of tokens: the presets train SFT rows of up to 8,192
# tokens and RL completions of up to 8,192 (<= 1.5B) or 4,096 tokens, as DAPO (20k), DeepSeek-R1-style recipes and
# verl's long-CoT examples (4k-8k at <= 8B) do. What makes that fit one GPU: the head's log-softmax in chunks
# (logprob_chunk_tokens), micro-batches by tokens (max_tokens_per_micro_batch, sized so one pass is about 32k
# tokens at <= 1.5B, less above), SFT gradient accumulation, gradient checkpointing, and LoRA at 8B. DAPO's soft
# overlong punishment takes the last eighth of the budget (DAPO: a 4k buffer under a 20k cap), so a chain learns
# to finish inside it; truncated samples keep training (the penalty is their signal; rl_round `truncated`).
#   [DAPO]      Yu et al. 2025: max response length 20,480, overlong buffer 4,096, penalty factor 1.0.
_SFT_COMMON = {
    "max_seq_len": 8192,
    "batch_size": 16,
    "gradient_accumulation_steps": 4,
    "max_steps": 500,
    "warmup_steps": 20,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.0,
    "checkpoint_every": 100,
    "gradient_checkpointing": True,
    "logprob_chunk_tokens": 256,
    "chat": {"system_prompt": "", "instructions": {}, "from_verifiers": True},
}
_RL_COMMON = {
    "steps": 100,
    "prompts_per_step": 32,
    "samples_per_prompt": 8,
    "max_new_tokens": 8192,
    "overlong_buffer": 1024,  # [DAPO]
    "overlong_penalty": 1.0,  # [DAPO]
    "truncated": "keep",
    "temperature": 1.0,
    "beta": 0.001,
    "checkpoint_every": 10,
    "rollout_engine": "auto",
    "gradient_checkpointing": True,
    "logprob_chunk_tokens": 256,
    "max_tokens_per_micro_batch": 32768,
}
_EVAL_COMMON = {
    "max_new_tokens": 8192,
    "n_samples": 4,
    "ks": [1, 4],
    "max_tasks_per_domain": 200,
    "batch_size": 64,
    "distractor_tokens": 512,
    "rollout_engine": "auto",
}
_RL_4K = {"max_new_tokens": 4096, "overlong_buffer": 512}  # [DAPO]'s eighth of the budget
PRETRAINED_TIERS: dict[str, dict[str, dict[str, Any]]] = {
    # <= 1.5B (Qwen2.5-0.5B/1.5B-Instruct, Llama-3.2-1B-Instruct): full fine-tuning.
    "1.5B": {
        "sft": {**_SFT_COMMON, "lr": 2e-5},  # [TRL-SFT]
        "rl_round": {**_RL_COMMON, "lr": 1e-6},  # [TRL-GRPO], [DSMath], [verl]
        "evaluate": dict(_EVAL_COMMON),
    },
    # <= 3B (Qwen2.5-3B-Instruct, Llama-3.2-3B-Instruct): full fine-tuning, a lower SFT rate.
    "3B": {
        "sft": {**_SFT_COMMON, "lr": 1e-5, "batch_size": 8},  # between [TRL-SFT] and [Tulu3]
        "rl_round": {**_RL_COMMON, **_RL_4K, "lr": 1e-6, "max_tokens_per_micro_batch": 16384},  # [TRL-GRPO]
        "evaluate": {**_EVAL_COMMON, "max_new_tokens": 4096, "batch_size": 32},
    },
    # <= 8B (Qwen2.5-7B-Instruct, Llama-3.1-8B-Instruct): LoRA on all linear layers.
    "8B": {
        "sft": {
            **_SFT_COMMON,
            "lr": 2e-4,
            "batch_size": 8,  # [QLoRA]
            "gradient_accumulation_steps": 8,
            "lora": {"enabled": True, "r": 16, "alpha": 32, "target_modules": "all-linear"},
        },
        "rl_round": {
            **_RL_COMMON,
            **_RL_4K,
            "lr": 1e-5,  # [LoRA-RL]: 10x [TRL-GRPO]
            "max_tokens_per_micro_batch": 8192,
            "lora": {"enabled": True, "r": 16, "alpha": 32, "target_modules": "all-linear"},
        },
        "evaluate": {**_EVAL_COMMON, "max_new_tokens": 4096, "batch_size": 16},
    },
}


# The largest model each tier is for, in billions of parameters (a little above the family sizes it names:
# Qwen2.5-1.5B has 1.54B, Llama-3.2-3B 3.2B, Llama-3.1-8B 8.0B).
TIER_LIMITS_B = {"1.5B": 1.8, "3B": 3.6, "8B": 8.6}


class NoPreset(ValueError):
    """The model is larger than every preset tier: its settings must be chosen, not guessed."""


def pretrained_tier(base_model: str, tier: str = "") -> str:
    """The preset tier of `base_model`: `tier` when given, else by its parameter count from config.json (no
    weights loaded; training/model_size.py), its name as the fallback, the smallest tier when neither says.
    Above 8B there is no preset: full RL of such a model needs sharding across GPUs, which a preset cannot
    size for a machine it does not know, so it is refused with what to do instead."""
    if tier:
        if tier not in PRETRAINED_TIERS:
            raise ValueError(f"preset tier {tier!r}: use one of {', '.join(PRETRAINED_TIERS)}")
        return tier
    size, source = model_size_b(base_model)
    if size is None:
        return "1.5B"
    for name, limit in TIER_LIMITS_B.items():
        if size <= limit:
            return name
    raise NoPreset(
        f"{base_model}: {size:.1f}B parameters (from its {source}) is above the largest preset tier "
        f"(8B: LoRA on one 80 GB GPU). Name a tier to start from (preset_tier: 8B) and set what differs through "
        "stage overrides (parallel: fsdp, nproc_per_node, micro_batch_size), or give every stage its config."
    )


def preset(profile: str, stage: str, base_model: str = "", tier: str = "") -> dict[str, Any]:
    """The config for `stage` ("rl_round_N" uses the "rl_round" entry; "rl-round" as the CLI names it): the
    pretrained-model tier of `base_model` when one is named (pretrained_tier), else the profile's."""
    key = stage.replace("-", "_")
    key = "rl_round" if key.startswith("rl_round") else key
    if base_model:
        return json.loads(json.dumps(PRETRAINED_TIERS[pretrained_tier(base_model, tier)].get(key, {})))
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    return dict(PROFILES[profile].get(key, {}))


# The stage-config fields that are configs of their own (dataclasses): an override of one of their keys merges
# into the preset's; every other field, a mapping or not (domain_weights, mix), is replaced whole.
# tests/training/test_presets.py checks the list against the config classes.
SUB_CONFIGS = ("chat", "lora", "parallel", "tiny")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base` (a copy): the sub-configs (SUB_CONFIGS) merged key by key, the rest replaced."""
    out = dict(base)
    for key, value in over.items():
        nested = key in SUB_CONFIGS and isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if nested else value
    return out


def apply_preset(
    stage: str, config: dict[str, Any], base_model: str = "", profile: str = "", tier: str = ""
) -> dict[str, Any]:
    """`config` laid over the stage's preset (pretrained tier of `base_model`, else `profile`'s; neither:
    `config` as it is), sub-configs merged (`lora.r` set keeps the preset's `lora.enabled`). The one function
    the DAGs (operators/pipeline.py) and the CLI (training/cli.py) apply presets with."""
    if not base_model and not profile:
        return dict(config)
    return deep_merge(preset(profile or "tiny", stage, base_model, tier), config)
