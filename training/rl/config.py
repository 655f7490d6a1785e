"""The RL round's config: `GRPOConfig`, one frozen dataclass read by `posttrain rl-round` (`--set key=value`).

Every field is documented once, in the class docstring; a paper reference stands beside each knob that needs one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from training.config import ConfigBase
from training.environments import environment_names
from training.modeling import distributed
from training.modeling.lora import LoraSettings
from training.rl import algorithms
from training.rl.overlong import TRUNCATED
from training.rollout import ENGINES

ANSWER_CREDITS = ("episode", "final", "turn")  # GRPOConfig.answer_credit


@dataclass(frozen=True)
class GRPOConfig(ConfigBase):
    """One GRPO round (stage `rl_round_<N>`).

    seed:               with the round number and step, determines prompt choice and sampling of every step.
    steps:              policy updates in this round.
    prompts_per_step:   groups (prompts) per update, B.
    samples_per_prompt: completions per prompt, G (GRPO's group size; Shao et al. 2024, "DeepSeekMath").
    max_new_tokens:     completion length cap for rollouts and the holdout check.
    overlong_buffer:    DAPO's soft overlong punishment (training/rl/overlong.py): over the last this-many tokens
                        before max_new_tokens the reward falls linearly to -overlong_penalty (a completion the cap
                        cut gets all of it), so the policy learns to finish inside its budget. 0 = off. A buffer
                        not below max_new_tokens takes an eighth of it (DAPO's proportion), so a preset's buffer
                        follows a shorter cap. Single-turn rounds only (an episode's length is its answers' and
                        the environment's).
    overlong_penalty:   the soft punishment's full size, in reward units.
    truncated:          "keep" (a completion the cap cut trains like any other) or "mask" (DAPO's overlong
                        filtering: its tokens leave the loss; it still counts in its group's advantages). The share
                        cut is logged every step as rollout/length_cut_frac.
    temperature, top_p: rollout sampling; the policy log-probs use the same temperature (as TRL does).
    lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping, constant LR after `warmup_steps`. Keep lr
                        low on small models: each Adam step moves every weight by ~lr whatever the signal, and
                        too high an lr collapses holdout pass@1 (the tiny profile's preset sits below that).
    warmup_steps:       linear LR warm-up at the start of the round.
    beta:               weight of the KL(policy || SFT reference) penalty; 0 disables the reference model.
    kl_estimator:       "k3" (unbiased, low variance, >= 0; Schulman 2020 "Approximating KL Divergence", as
                        in DeepSeekMath), or "k1"/"k2".
    advantage:          registered estimator (training.rl.algorithms): "grpo" (centred on the group mean and
                        divided by the group's reward std), "dr_grpo" (centred only; Liu et al. 2025 argue
                        the std division over-weights near-uniform groups), "rloo" (minus the mean of the
                        group's other samples; Ahmadian et al. 2024) or "reinforce_pp" (centred on the group
                        mean, then divided by the whole step's std; REINFORCE++, Hu et al. 2025).
    policy_loss:        registered policy loss (training.rl.algorithms): "clip" (PPO's clipped surrogate per
                        token), "gspo" (one length-normalised ratio per sequence, clipped per sequence; Zheng
                        et al. 2025: use clip_low 3e-4, clip_high 4e-4) or "cispo" (the clipped ratio as a
                        stop-gradient weight on log p, so no token leaves the gradient; MiniMax-M1 2025).
    clip_low, clip_high: ratio clip range [1-clip_low, 1+clip_high]: PPO's (Schulman et al. 2017), GSPO's on
                        the sequence ratio, CISPO's on its weight (clip_low >= 1 leaves the lower side open);
                        clip_high > clip_low is DAPO's "clip-higher" (Yu et al. 2025).
    loss_agg:           one of algorithms.LOSS_AGGREGATIONS: "token-mean" (DAPO token-level: every token
                        weighs the same), "seq-mean-token-mean" (original GRPO) or "seq-mean-token-sum".
    updates_per_batch:  optimizer passes over each rollout batch (GRPO's mu); 1 = strictly on-policy.
    micro_batch_size:   completions per forward/backward, whole groups, ordered by length and padded per
                        micro-batch (gradients accumulate across them; the loss equals the whole-batch loss);
                        0 = one micro-batch.
    max_tokens_per_micro_batch: > 0: micro-batches hold at most this many tokens as laid out (rows x the
                        longest row, padding included) instead of `micro_batch_size` completions, and a group may
                        span micro-batches (training.rl.grpo_batches.token_budget_plan): at reasoning lengths one
                        group of G long completions is already more than a device holds. 0 = by completions.
    logprob_chunk_tokens: the update's log-probs (policy, old policy, reference) go through the output projection
                        this many completion tokens at a time (training.modeling.chunked_logprobs), so no
                        (tokens, vocabulary) fp32 logits live at once: at V = 151,936 those are 0.6 MB a token,
                        kept for the backward. Equal to the full path to float rounding; 0 = the full path. A head
                        that is not a plain Linear (LoRA on it, FSDP-sharded) or a logit transform after it takes
                        the full path whatever this says.
    packed_groups:      lay each group out as one row (the prompt once, its completions back to back, a
                        block attention mask) instead of one padded row per completion: fewer tokens
                        through the model in the update (training.rl.grpo_batches). Needs eager or sdpa attention.
    packed_attention:   how a packed row keeps its completions apart. "auto": by segments (each completion's
                        [prompt | completion] gathered and run with SDPA's causal kernel, no (T, T) mask:
                        training.modeling.packed_attention) where the policy and the reference take it (SDPA
                        models whose probe against the mask passes); else, and with "dense", the 4D mask.
    pack_where_cheaper: with packed_groups, pack a micro-batch only where that costs fewer FLOPs than padding
                        (training.rl.grpo_batches.packing_pays): completions about equally long (long ones that
                        all hit the cap) are padded, since packed attention grows with the square of the whole
                        group. False packs every micro-batch (the tiny profile, whose lift figures were
                        measured that way); so does FSDP over several ranks, whose ranks must run the same
                        forwards.
    dynamic_sampling:   drop zero-variance groups and refill (DAPO); bounded by `max_sampling_batches`.
    min_informative:    fraction of prompts_per_step that must be informative groups before the update runs
                        (fewer after max_sampling_batches draws: update on what there is, or skip if none).
    max_sampling_batches: rollout draws per step at most.
    domain_weights:     domain mixing ratios for the prompts of a step ({} = uniform over train domains).
    curriculum:         weight difficulties by their running pass rate: weight 1 inside `curriculum_band`,
                        `curriculum_floor` outside (a group's reward variance p(1-p) is largest mid-band;
                        cf. DAPO dynamic sampling and "online difficulty filtering", Bae et al. 2025).
    curriculum_band:    [low, high] pass-rate band that counts as learnable.
    curriculum_floor:   weight of difficulties outside the band (never 0: rates drift).
    curriculum_ema:     update rate of the running pass rate per (domain, difficulty).
    rollout_correction: "auto" (TIS with vLLM, none with the transformers engine, which samples from the
                        trainer's own weights), "tis" or "none": truncated importance sampling on the engine's
                        log-probs (training.rl.algorithms.truncated_is_weights); the mismatch KL is logged.
    tis_cap:            TIS truncation C (verl and TRL use 2).
    max_prompt_tokens:  prompts longer than this (after chat rendering) are dropped with a count, never cut;
                        0 = the model's context minus max_new_tokens.
    lora:               LoRA for RL (training.modeling.lora.LoraSettings, target "all-linear"): only adapters train, and
                        the reference for the KL term is the base with its adapters disabled, i.e. the policy
                        this round started from, with no second copy of the model.
    ref_device:         where the reference model (no LoRA, beta > 0) lives: "same" or "cpu" (offloaded: its
                        forward runs on the CPU, freeing accelerator memory for the policy).
    precision:          "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16".
    gradient_checkpointing: recompute activations in the backward pass.
    optimizer_offload:  keep AdamW's state and an fp32 master copy of the weights in CPU memory
                        (training.modeling.optimizers.CPUOffloadAdamW): the device holds the weights and gradients
                        only, at the cost of a host round trip a step. For full fine-tuning of the 8B tier on one
                        GPU; the same updates as on the device.
    fused_optimizer:    AdamW's fused kernel where torch has one (CPU and CUDA tensors; not FSDP shards): no
                        per-parameter temporaries at the step. False: torch's per-parameter loop, the same
                        updates to float rounding (the tiny profile: its lift figures were measured with it).
    checkpoint_every:   steps between resumable checkpoints (0 = none).
    keep_checkpoints:   mid-round checkpoints kept (the newest N); the round's final model is always kept.
    holdout_per_domain: holdout tasks per domain for the end-of-round check (0 = all).
    log_samples:        sample rollouts logged as an MLflow table (from the last step and the holdout).
    rollout_engine:     "auto" (vLLM when the device is CUDA and vllm is installed, else transformers), "hf"
                        (transformers, shares the trainer's model) or "vllm".
    rollout_batch_size: sequences per engine call (hf).
    vllm_gpu_memory_utilization, vllm_max_model_len, vllm_prefix_caching, vllm_sleep_mode,
    vllm_tensor_parallel_size: the vLLM engine's settings (training/rollout/vllm.py); with sleep mode the engine
                        gives its GPU memory back to the trainer during the update.
    device:             "cpu", "cuda" or "auto".
    max_turns:          answers per episode, T. 1 (the default) is the single-turn rollout, exactly as before. With
                        T > 1 a task whose domain has an environment (`environments`) is an episode: after each
                        answer the environment replies as the next user turn (code: the visible tests' failure,
                        naming what was expected) until it is satisfied or T answers were given; the reward is the
                        verifier's (hidden tests) on the final answer, advantages are group-relative over whole
                        episodes, and the loss covers the model's tokens only (training/environments/episodes.py).
    environments:       domain -> environment (training/environments) for T > 1, overriding the one the task's
                        verifier names (`Verifier.environment`; code: "code_repair"); "" = single-turn. A domain
                        a user adds plays its verifier's environment with no setting here.
    turn_cost:          subtracted from an episode's reward per answer after the first (0 = none): prefers
                        getting it right first.
    answer_credit:      how an episode's answers share credit. "episode" (default): the whole episode takes one
                        advantage, so a wrong first answer that a later turn repaired is reinforced like a right
                        one. "final": where the advantage is positive, the answers before the last (each one the
                        environment rejected) leave the loss (training.environments.episodes.final_answer_credit);
                        where it is negative every answer keeps its share. "turn" (turn-level credit, as in
                        Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
                        Assignment"): in a group the model opened itself (not planted) where some episode went
                        past one answer, each first answer takes its own group-relative advantage from the
                        verifier's score of that answer alone (exactly a single-turn round's signal) and the later
                        answers take the episode's; such a group is informative when either set of rewards varies
                        (a group that always ends right but not always first time still trains first attempts).
    planted_share:      with T > 1, the share of groups whose episodes start from a planted wrong first answer
                        instead of a sampled one (0 = none), among tasks whose environment can plant one (code
                        repair: a near miss of the reference, the task read the other way where it can be, that
                        fails the visible tests). The planted answer is masked from the loss like the
                        environment's replies; every sample of the group answers the failure, so the round
                        practises repair even where the model's own first attempts already pass (the tasks SFT
                        trained on).
    planted_mirrors:    a planted group answers its task's mirror instead (an environment with `mirror_tasks`;
                        code repair: the same prompt, with tests that ask for what the planted near miss
                        returns), starting from the task's reference. On a prompt SFT trained on, the model's
                        memorised answer is then the failed one, so turn 2 earns its reward only by following the
                        error; with plain plants it can recall the reference and ignore the error.
    sandbox_url:        the sandbox HTTP service code rewards run on (e.g. http://sandbox:8081; its token from
                        POSTTRAIN_SANDBOX_TOKEN); "" = POSTTRAIN_SANDBOX_URL, else the local sandbox pool.
    parallel:           under torchrun (N processes): DDP or FSDP for the update, rollout seeding, the weight-sync
                        bucket, the memory check (training.modeling.distributed.ParallelConfig). prompts_per_step
                        stays the global batch: each rank samples and scores its share of the prompts, the groups
                        are gathered on every rank (advantages, dynamic sampling and the curriculum see them all),
                        and each rank updates on its share of the kept groups. Each rank runs its own rollout
                        engine (data-parallel engines); with FSDP the hf engine samples from a full replica
                        refreshed after every update by gathering the shards bucket by bucket.
    """

    seed: int = 0
    steps: int = 50
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_new_tokens: int = 40
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    truncated: str = "keep"
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = 1.0
    warmup_steps: int = 0
    beta: float = 0.01
    kl_estimator: str = "k3"
    advantage: str = "grpo"
    policy_loss: str = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: str = "token-mean"
    updates_per_batch: int = 1
    micro_batch_size: int = 64
    max_tokens_per_micro_batch: int = 0
    logprob_chunk_tokens: int = 256
    packed_groups: bool = True
    pack_where_cheaper: bool = True
    packed_attention: str = "auto"
    dynamic_sampling: bool = True
    min_informative: float = 0.5
    max_sampling_batches: int = 3
    domain_weights: dict[str, float] = field(default_factory=dict)
    curriculum: bool = True
    curriculum_band: list[float] = field(default_factory=lambda: [0.1, 0.9])
    curriculum_floor: float = 0.2
    curriculum_ema: float = 0.3
    rollout_correction: str = "auto"
    tis_cap: float = 2.0
    max_prompt_tokens: int = 0
    lora: LoraSettings = field(default_factory=LoraSettings)
    ref_device: str = "same"
    precision: str = "auto"
    gradient_checkpointing: bool = False
    optimizer_offload: bool = False
    fused_optimizer: bool = True
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    holdout_per_domain: int = 0
    log_samples: int = 32
    rollout_engine: str = "hf"
    rollout_batch_size: int = 512
    vllm_gpu_memory_utilization: float = 0.4
    vllm_max_model_len: int = 0
    vllm_prefix_caching: bool = True
    vllm_sleep_mode: bool = True
    vllm_tensor_parallel_size: int = 1
    device: str = "auto"
    max_turns: int = 1
    environments: dict[str, str] = field(default_factory=dict)
    turn_cost: float = 0.0
    answer_credit: str = "episode"
    planted_share: float = 0.0
    planted_mirrors: bool = False
    sandbox_url: str = ""
    parallel: distributed.ParallelConfig = field(default_factory=distributed.ParallelConfig)

    def __post_init__(self) -> None:
        algorithms.get_advantage(self.advantage)
        algorithms.get_policy_loss(self.policy_loss)
        algorithms.get_kl(self.kl_estimator)
        if self.policy_loss == "gspo" and max(self.clip_low, self.clip_high) > 0.01:
            # not refused: a wider range is a choice, but almost always PPO's 0.2 left in place by mistake
            logging.getLogger("posttrain").warning(
                "policy_loss gspo with clip range (%g, %g): a sequence ratio stays near 1, so PPO's token range "
                "barely clips; Zheng et al. use (3e-4, 4e-4)",
                self.clip_low,
                self.clip_high,
            )
        if self.loss_agg not in algorithms.LOSS_AGGREGATIONS:
            raise ValueError(f"loss_agg {self.loss_agg!r}: use one of {', '.join(algorithms.LOSS_AGGREGATIONS)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2 (group-relative advantages need a group)")
        if self.rollout_engine != "auto" and self.rollout_engine not in ENGINES:
            raise ValueError(f"rollout_engine {self.rollout_engine!r}: use auto or one of {', '.join(ENGINES)}")
        if self.packed_attention not in ("auto", "dense"):
            raise ValueError(f"packed_attention {self.packed_attention!r}: use auto or dense")
        if self.rollout_correction not in ("auto", "tis", "none"):
            raise ValueError(f"rollout_correction {self.rollout_correction!r}: use auto, tis or none")
        if self.ref_device not in ("same", "cpu"):
            raise ValueError(f"ref_device {self.ref_device!r}: use same or cpu")
        if self.truncated not in TRUNCATED:
            raise ValueError(f"truncated {self.truncated!r}: use one of {', '.join(TRUNCATED)}")
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0 (0 = off), got {self.overlong_buffer}")
        if self.max_tokens_per_micro_batch < 0:
            raise ValueError(
                f"max_tokens_per_micro_batch must be >= 0 (0 = by completions), got {self.max_tokens_per_micro_batch}"
            )
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens must be >= 0 (0 = the full path), got {self.logprob_chunk_tokens}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 <= self.planted_share <= 1.0 or (self.planted_share > 0 and self.max_turns < 2):
            raise ValueError(
                f"planted_share must be in [0, 1] and needs max_turns >= 2, got "
                f"{self.planted_share} with max_turns {self.max_turns}"
            )
        if self.answer_credit not in ANSWER_CREDITS:
            raise ValueError(f"answer_credit {self.answer_credit!r}: use one of {', '.join(ANSWER_CREDITS)}")
        if self.planted_mirrors and self.planted_share <= 0:
            raise ValueError("planted_mirrors needs planted_share > 0")
        unknown = sorted(set(self.environments.values()) - set(environment_names()) - {""})
        if unknown:
            raise ValueError(f"environments name {unknown}; known: {', '.join(environment_names())}")
