"""Stage `rl_round_<N>` (`posttrain rl-round --round N`): one round of GRPO on the task set's train split.

    posttrain rl-round --round 1 --run file:///tmp/runs/r1 --set steps=50 --set lr=2e-4

The policy starts from the previous stage's model (`sft` for round 1, `rl_round_<N-1>` after); the frozen
reference for the KL penalty is always the SFT model. Each step:

1. pick prompts: a domain mix (`domain_weights`) and, inside a domain, a curriculum over difficulties that
   favours those whose running pass rate lies in a middle band (they give informative groups);
2. sample `samples_per_prompt` completions per prompt through a RolloutEngine (transformers on CPU, vLLM on GPU);
3. score them with the verifiers (`training.rewards.score_tasks`; code runs in the sandbox in one batch);
4. group-relative advantages; groups whose rewards are all equal carry no signal and are dropped, and more
   prompts are sampled until the batch has enough informative groups (DAPO dynamic sampling, bounded);
5. one clipped-ratio policy-gradient update with a k3 KL penalty to the reference, token-level aggregation.

Everything random in step s is derived from (seed, round, s), and a checkpoint every `checkpoint_every` steps
holds model, optimizer, RNG and curriculum state, so a run killed at any point and retried ends with the same
final metrics as one that was never interrupted. The round ends with a greedy pass@1 check on the holdout split
per domain (before and after), in the stage summary and in MLflow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from training import algorithms, checkpointing, distributed, models
from training.chat import PromptFormat
from training.config import ConfigBase
from training.curriculum import Curriculum, domain_counts, pick_prompts
from training.devices import resolve_device
from training.grpo_batches import (
    PackedGroups,
    RolloutBatch,
    attention_pair_cost,
    completion_logprobs,
    micro_batches,
    takes_4d_mask,
)
from training.lora import LoraSettings, apply_lora, is_lora, merged_state_dict, reference_mode
from training.optimizers import adamw
from training.phases import PhaseTimer
from training.precision import autocast, enable_gradient_checkpointing, resolve_precision
from training.rewards.code import use_remote_sandbox
from training.rollout import ENGINES, Completion, make_engine
from training.rollout.base import length_cut_share
from training.stage import StageContext, rl_round_stage
from training.tasksets.schema import Task

# ----- config -------------------------------------------------------------------------------------------------
ANSWER_CREDITS = ("episode", "final", "turn")  # GRPOConfig.answer_credit
# answer_credit "turn": a group's episodes each split into (first answer, the rest), and the first answers' rewards
FirstSplit = tuple[list[tuple[Completion, Completion]], list[float]]


@dataclass(frozen=True)
class GRPOConfig(ConfigBase):
    """One GRPO round (stage `rl_round_<N>`).

    seed:               with the round number and step, determines prompt choice and sampling of every step.
    steps:              policy updates in this round.
    prompts_per_step:   groups (prompts) per update, B.
    samples_per_prompt: completions per prompt, G (GRPO's group size; Shao et al. 2024, "DeepSeekMath").
    max_new_tokens:     completion length cap for rollouts and the holdout check.
    temperature, top_p: rollout sampling; the policy log-probs use the same temperature (as TRL does).
    lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping, constant LR after `warmup_steps`. The
                        tiny profile needs lr <= 2e-4 at 32x8 samples per step: 3e-4 at 16x8 made holdout
                        pass@1 collapse (each Adam step moves every weight by ~lr whatever the signal).
    warmup_steps:       linear LR warm-up at the start of the round.
    beta:               weight of the KL(policy || SFT reference) penalty; 0 disables the reference model.
    kl_estimator:       "k3" (unbiased, low variance, >= 0; Schulman 2020 "Approximating KL Divergence", as
                        in DeepSeekMath), or "k1"/"k2".
    advantage:          registered estimator (training.algorithms): "grpo" (centred on the group mean and
                        divided by the group's reward std) or "dr_grpo" (centred only; Liu et al. 2025 argue
                        the std division over-weights near-uniform groups).
    policy_loss:        registered policy loss (training.algorithms): "clip" (PPO's clipped surrogate).
    clip_low, clip_high: PPO ratio clip range [1-clip_low, 1+clip_high] (Schulman et al. 2017); clip_high >
                        clip_low is DAPO's "clip-higher" (Yu et al. 2025).
    loss_agg:           one of algorithms.LOSS_AGGREGATIONS: "token-mean" (DAPO token-level: every token
                        weighs the same), "seq-mean-token-mean" (original GRPO) or "seq-mean-token-sum".
    updates_per_batch:  optimizer passes over each rollout batch (GRPO's mu); 1 = strictly on-policy.
    micro_batch_size:   completions per forward/backward, whole groups, ordered by length and padded per
                        micro-batch (gradients accumulate across them; the loss equals the whole-batch loss);
                        0 = one micro-batch.
    packed_groups:      lay each group out as one row (the prompt once, its completions back to back, a
                        block attention mask) instead of one padded row per completion: ~3x fewer tokens
                        through the model in the update (training.grpo_batches). Needs eager or sdpa attention.
    pack_where_cheaper: with packed_groups, pack a micro-batch only where that costs fewer FLOPs than padding
                        (training.grpo_batches.packing_pays): completions about equally long (long ones that
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
                        log-probs (training.algorithms.truncated_is_weights); the mismatch KL is logged.
    tis_cap:            TIS truncation C (verl and TRL use 2).
    max_prompt_tokens:  prompts longer than this (after chat rendering) are dropped with a count, never cut;
                        0 = the model's context minus max_new_tokens.
    lora:               LoRA for RL (training.lora.LoraSettings, target "all-linear"): only adapters train, and
                        the reference for the KL term is the base with its adapters disabled, i.e. the policy
                        this round started from, with no second copy of the model.
    ref_device:         where the reference model (no LoRA, beta > 0) lives: "same" or "cpu" (offloaded: its
                        forward runs on the CPU, freeing accelerator memory for the policy).
    precision:          "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16".
    gradient_checkpointing: recompute activations in the backward pass.
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
    environments:       domain -> environment (training/environments) for T > 1; other domains stay single-turn.
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
                        bucket, the memory check (training.distributed.ParallelConfig). prompts_per_step stays the
                        global batch: each rank samples and scores its share of the prompts, the groups are
                        gathered on every rank (advantages, dynamic sampling and the curriculum see them all),
                        and each rank updates on its share of the kept groups. Each rank runs its own rollout
                        engine (data-parallel engines); with FSDP the hf engine samples from a full replica
                        refreshed after every update by gathering the shards bucket by bucket.
    """

    seed: int = 0
    steps: int = 50
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_new_tokens: int = 40
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
    packed_groups: bool = True
    pack_where_cheaper: bool = True
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
    environments: dict[str, str] = field(default_factory=lambda: {"code": "code_repair"})
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
        if self.loss_agg not in algorithms.LOSS_AGGREGATIONS:
            raise ValueError(f"loss_agg {self.loss_agg!r}: use one of {', '.join(algorithms.LOSS_AGGREGATIONS)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2 (group-relative advantages need a group)")
        if self.rollout_engine != "auto" and self.rollout_engine not in ENGINES:
            raise ValueError(f"rollout_engine {self.rollout_engine!r}: use auto or one of {', '.join(ENGINES)}")
        if self.rollout_correction not in ("auto", "tis", "none"):
            raise ValueError(f"rollout_correction {self.rollout_correction!r}: use auto, tis or none")
        if self.ref_device not in ("same", "cpu"):
            raise ValueError(f"ref_device {self.ref_device!r}: use same or cpu")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 <= self.planted_share <= 1.0 or (self.planted_share > 0 and self.max_turns < 2):
            raise ValueError(f"planted_share must be in [0, 1] and needs max_turns >= 2, got "
                             f"{self.planted_share} with max_turns {self.max_turns}")
        if self.answer_credit not in ANSWER_CREDITS:
            raise ValueError(f"answer_credit {self.answer_credit!r}: use one of {', '.join(ANSWER_CREDITS)}")
        if self.planted_mirrors and self.planted_share <= 0:
            raise ValueError("planted_mirrors needs planted_share > 0")
        from training.environments import ENVIRONMENTS

        unknown = sorted(set(self.environments.values()) - set(ENVIRONMENTS))
        if unknown:
            raise ValueError(f"environments name {unknown}; known: {', '.join(sorted(ENVIRONMENTS))}")


def resolve_engine(name: str, device: torch.device) -> str:
    """"auto" is vLLM on a CUDA device when vllm is installed, else transformers."""
    if name != "auto":
        return name
    from training.rollout.vllm import HAVE_VLLM

    return "vllm" if device.type == "cuda" and HAVE_VLLM else "hf"


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from (seed, round, step, ...): stable across processes (unlike hash())."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


# ----- the update ---------------------------------------------------------------------------------------------
def reference_logprobs(model: Any, ref_model: Any | None, chunk: RolloutBatch | PackedGroups,
                       temperature: float) -> torch.Tensor:
    """log-probs under the KL reference: `ref_model` (on whatever device it lives), or with LoRA the policy's
    own base with adapters disabled. (n, L)."""
    if ref_model is None:
        with reference_mode(model):
            return completion_logprobs(model, chunk, temperature)
    ref_device = next(ref_model.parameters()).device
    here = chunk.completion_mask.device
    if ref_device != here:  # an offloaded reference: run its forward where it lives
        moved = dataclasses.replace(chunk, **{f.name: getattr(chunk, f.name).to(ref_device)
                                              for f in dataclasses.fields(chunk)
                                              if isinstance(getattr(chunk, f.name), torch.Tensor)})
        return completion_logprobs(ref_model, moved, temperature).to(here)
    return completion_logprobs(ref_model, chunk, temperature)


def use_tis(cfg: GRPOConfig, engine_name: str) -> bool:
    return cfg.rollout_correction == "tis" or (cfg.rollout_correction == "auto" and engine_name == "vllm")


def policy_update(model: Any, ref_model: Any | None, optimizer: torch.optim.Optimizer,
                  chunks: Sequence[RolloutBatch | PackedGroups], cfg: GRPOConfig, tis: bool = False,
                  compute_dtype: torch.dtype = torch.float32, trainer: Any | None = None,
                  live: Sequence[bool] | None = None, timer: PhaseTimer | None = None) -> dict[str, float]:
    """`updates_per_batch` optimizer steps on one rollout batch (as micro-batches); averaged loss statistics.
    The KL reference is `ref_model`, or with a LoRA policy its adapter-disabled base. With `tis`, each token's
    policy gradient is weighted by the truncated trainer/engine probability ratio.

    Under N ranks `chunks` are this rank's share and `trainer` the DDP/FSDP module; the normalisers are global
    and the loss is scaled by N, so the averaged gradient is the whole batch's. Every rank must run the same
    number of forward/backward passes (each is a collective), so a rank pads its chunks with copies marked
    not `live`: they run, with weight 0. `timer` (if given) is charged the reference forward, the policy's
    forward and backward, and the optimizer step (clipping included)."""
    device = chunks[0].completion_mask.device
    timer = timer or PhaseTimer()
    trainer = model if trainer is None else trainer
    world = distributed.world_size()
    weight = [1.0 if live is None or alive else 0.0 for alive in (live or [True] * len(chunks))]
    with torch.no_grad(), autocast(device, compute_dtype):
        has_ref = cfg.beta and (ref_model is not None or is_lora(model))
        with timer.phase("reference"):
            ref_logp = ([reference_logprobs(model, ref_model, c, cfg.temperature) for c in chunks]
                        if has_ref else None)  # [(n, L_c)]
        with timer.phase("policy"):
            old_logp = ([completion_logprobs(trainer, c, cfg.temperature) for c in chunks]
                        if cfg.updates_per_batch > 1 else None)  # [(n, L_c)]
    n_tokens = torch.stack([c.completion_mask.sum() for c in chunks]).sum().clamp(min=1)
    n_seqs = sum(c.completion_mask.shape[0] for c in chunks)
    if world > 1:  # global normalisers, from the live chunks of every rank
        n_tokens = torch.tensor(distributed.sum_over_ranks(
            sum(float(c.completion_mask.sum()) * w for c, w in zip(chunks, weight))), device=device).clamp(min=1)
        n_seqs = int(distributed.sum_over_ranks(sum(c.completion_mask.shape[0] * w for c, w in zip(chunks, weight))))
    stats: dict[str, float] = defaultdict(float)
    for _ in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        with timer.phase("policy"):  # forward and backward of every micro-batch
            for j, c in enumerate(chunks):
                mask = c.completion_mask.float()  # (n, L_c)
                with autocast(device, compute_dtype):
                    logp = completion_logprobs(trainer, c, cfg.temperature)  # (n, L_c)
                old = old_logp[j] if old_logp is not None else logp.detach()  # (n, L_c)
                weights = None
                if tis and c.engine_logprobs is not None:
                    weights = algorithms.truncated_is_weights(old, c.engine_logprobs, cfg.tis_cap)  # (n, L_c)
                loss, st = algorithms.grpo_loss(
                    logp, old, ref_logp[j] if ref_logp is not None else None, c.advantages, mask,
                    beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.loss_agg,
                    kl_estimator=cfg.kl_estimator, policy_loss=cfg.policy_loss, is_weights=weights)
                if c.engine_logprobs is not None:
                    st["rollout_mismatch_kl"] = algorithms.mismatch_kl(old, c.engine_logprobs, mask)
                # mean -log p of the sampled tokens: an estimate of the policy's per-token entropy (its samples
                # are on-policy), for the gate's collapse check
                st["entropy"] = algorithms.masked_mean(-logp.detach(), mask)
                # Micro-batches share one normaliser, so accumulation equals the whole-batch loss.
                share = mask.sum() / n_tokens if cfg.loss_agg == "token-mean" else c.completion_mask.shape[0] / n_seqs
                if world > 1:  # DDP/FSDP average gradients over the ranks; padding chunks weigh 0
                    share = share * weight[j]
                    (loss * share * world).backward()
                else:
                    (loss * share).backward()
                for k, v in st.items():
                    stats[k] += float(v) * float(share) / cfg.updates_per_batch
                stats["loss"] += float(loss.detach()) * float(share) / cfg.updates_per_batch
        with timer.phase("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0
                                                       else float("inf"))
            optimizer.step()
        stats["grad_norm"] += distributed.scalar(grad_norm) / cfg.updates_per_batch
    if world > 1:  # each rank's stats are its share of the global ones; the norm is already global
        norm = stats.pop("grad_norm")
        stats = defaultdict(float, distributed.all_reduce_sum(stats))
        stats["grad_norm"] = norm
    return dict(stats)


# ----- holdout check ------------------------------------------------------------------------------------------
def holdout_pass_at_1(engine: Any, tasks: list[Task], max_new_tokens: int,
                      fmt: PromptFormat | None = None) -> tuple[dict[str, float], list[dict]]:
    """Greedy pass@1 per domain (and "all"), plus the rows (for a samples table). Prompts are rendered with
    `fmt` (the chat template) when given."""
    from training.rewards import verify_tasks

    prompts = [fmt.prompt_ids(t) for t in tasks] if fmt is not None else [t.prompt for t in tasks]
    groups = engine.generate(prompts, n_samples=1, max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    texts = [g[0].text for g in groups]
    scores = [float(ok) for ok in verify_tasks(tasks, texts)]  # pass rates, not (weighted) rewards
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(tasks, scores):
        by_domain[t.domain].append(s)
    rates = {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rates["all"] = sum(scores) / max(1, len(scores))
    shown = [engine_text(engine, p) for p in prompts]
    rows = [{"id": t.id, "domain": t.domain, "difficulty": t.difficulty, "prompt": shown_prompt, "completion": c,
             "finish_reason": g[0].finish_reason, "reward": s}
            for t, shown_prompt, g, c, s in zip(tasks, shown, groups, texts, scores)]
    return rates, rows


def engine_text(engine: Any, prompt: Any) -> str:
    """A prompt as the model saw it (chat rendering and special tokens included), for sample tables."""
    if isinstance(prompt, str):
        return prompt
    return str(engine.tokenizer.decode(list(prompt), skip_special_tokens=False))


def fitting_tasks(fmt: PromptFormat, tasks: list[Task], limit: int) -> tuple[list[Task], int]:
    """The tasks whose rendered prompt has at most `limit` tokens, and how many were dropped (never cut)."""
    kept = [t for t in tasks if len(fmt.prompt_ids(t)) <= limit]
    return kept, len(tasks) - len(kept)


def prompt_limit(cfg_limit: int, model: Any, max_new_tokens: int) -> int:
    """max_prompt_tokens, or the model's context minus the completion budget when 0."""
    if cfg_limit:
        return cfg_limit
    from training.evaluation.measure import context_limit

    context = context_limit(model)
    return max(1, int(context) - max_new_tokens) if context else 1 << 30


def holdout_subset(tasks: list[Task], per_domain: int) -> list[Task]:
    if not per_domain:
        return tasks
    seen: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        if seen[t.domain] < per_domain:
            out.append(t)
            seen[t.domain] += 1
    return out


# ----- the stage ----------------------------------------------------------------------------------------------
def load_policy(ctx: StageContext, stage: str, device: torch.device,
                dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    model, tokenizer = models.load_model(ctx.input(stage).uri, "model", dtype=dtype,
                                         cache_dir=ctx.workdir / f"model-{stage}")
    return model.to(device), tokenizer


@dataclass
class Round:
    """Everything one GRPO round works on; `step(s)` runs training step s (a pure function of the state)."""

    cfg: GRPOConfig
    round: int
    model: Any
    tokenizer: Any
    ref_model: Any | None
    optimizer: torch.optim.Optimizer
    engine: Any
    pool: dict[str, dict[int, list[Task]]]
    curriculum: Curriculum
    device: torch.device
    fmt: PromptFormat
    engine_name: str = "hf"
    compute_dtype: torch.dtype = torch.float32
    prompts_dropped: int = 0
    samples_seen: int = 0
    last_rows: list[dict] = field(default_factory=list)
    last_episodes: list[dict] = field(default_factory=list)  # multi-turn: sample episodes of the last step
    _prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    _openings: dict[str, list[int]] = field(default_factory=dict)  # an environment's opening prompt per task
    _episodes: list[Any] = field(default_factory=list)  # the current draw's episodes (multi-turn)
    # answer_credit "turn": the current draw's groups split for turn-level credit (None: not split)
    _first_splits: list[FirstSplit | None] = field(default_factory=list)
    trainer: Any = None  # the module the update runs through: DDP around `model`, or `model` (FSDP, 1 process)
    rollout_model: Any = None  # what the hf engine samples from: `model`, or a full replica under FSDP
    timer: PhaseTimer = field(default_factory=PhaseTimer)  # the current step's time per phase (time/<phase>_s)
    pair_cost: float = 0.0  # attention cost per (query, key) pair: packs a micro-batch only where that pays (0: all)

    @classmethod
    def build(cls, cfg: GRPOConfig, round_: int, model: Any, tokenizer: Any, ref_model: Any | None,
              train_tasks: list[Task], device: torch.device, trainer: Any = None,
              rollout_model: Any = None) -> Round:
        fmt = PromptFormat(tokenizer, getattr(tokenizer, "chat_settings", None), model.generation_config)
        limit = prompt_limit(cfg.max_prompt_tokens, model, cfg.max_new_tokens)
        train_tasks, dropped = fitting_tasks(fmt, train_tasks, limit)
        pool: dict[str, dict[int, list[Task]]] = defaultdict(lambda: defaultdict(list))
        for t in train_tasks:
            pool[t.domain][t.difficulty].append(t)
        if not pool:
            raise ValueError(f"rl_round: no train task has a prompt within {limit} tokens ({dropped} dropped)")
        unknown = sorted(set(cfg.domain_weights) - set(pool))
        if unknown:
            raise ValueError(f"domain_weights name domains {unknown} absent from the train split {sorted(pool)}")
        optimizer = adamw(model, cfg.lr, cfg.betas, cfg.weight_decay)
        engine_name = resolve_engine(cfg.rollout_engine, device)
        rollout_model = model if rollout_model is None else rollout_model
        engine = make_engine(engine_name, rollout_model, tokenizer, stop_ids=fmt.stop_ids,
                             **engine_options(cfg, engine_name))
        low, high = cfg.curriculum_band
        curriculum = Curriculum((low, high), cfg.curriculum_floor, cfg.curriculum_ema)
        # kernels run asynchronously on CUDA: sync at phase boundaries, or a phase is charged its predecessor's work
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        # Under FSDP every rank must run the same sequence of forwards (each one all-gathers the parameters):
        # a padded micro-batch runs the prompts and the completions as two forwards, a packed one as one, and
        # ranks choosing differently deadlock. So FSDP over several ranks packs every micro-batch.
        choose_layout = cfg.pack_where_cheaper and not (distributed.world_size() > 1
                                                        and cfg.parallel.strategy == "fsdp")
        return cls(cfg, round_, model, tokenizer, ref_model, optimizer, engine, pool, curriculum, device, fmt,
                   engine_name, resolve_precision(cfg.precision, device), dropped,
                   trainer=model if trainer is None else trainer, rollout_model=rollout_model,
                   timer=PhaseTimer(sync=sync), pair_cost=attention_pair_cost(model) if choose_layout else 0.0)

    def sync_rollout_weights(self) -> float | None:
        """Give the rollout engine the newest policy; seconds taken, or None when it already samples from the
        trainer's own weights (hf engine, no FSDP). Under FSDP the shards are gathered bucket by bucket (a
        collective: every rank calls this) into the hf engine's replica or the rank's vLLM engine."""
        sharded = distributed.is_sharded(self.model)
        if self.engine_name == "hf" and not sharded:
            return None
        if not sharded:
            self.engine.update_weights(merged_state_dict(self.model))
            return float(self.engine.last_sync_s)
        started = time.monotonic()
        for bucket in distributed.full_tensors(self.model, self.cfg.parallel.weight_sync_bucket_mb):
            if self.engine_name == "hf":
                with torch.no_grad():
                    self.rollout_model.load_state_dict(bucket, strict=False)
            else:
                self.engine.update_weights(bucket)
        return time.monotonic() - started

    def rollouts(self, tasks: list[Task], step: int, draw: int) -> tuple[list[list[Completion]], list[float]]:
        """G completions of each task and their rewards. One process with batch seeding: one engine call seeded by
        (seed, round, step, draw), exactly as always. Under N ranks each rank samples and scores its share of the
        prompts (seeded by its rank, or per prompt with rollout_seeding=prompt) and the groups are gathered, in
        order, on every rank."""
        from training.rewards import score_tasks

        cfg, G = self.cfg, self.cfg.samples_per_prompt
        seeding = cfg.parallel.rollout_seeding
        if cfg.max_turns > 1:
            return self.episode_rollouts(tasks, step, draw)
        if distributed.world_size() == 1 and seeding == "batch":
            with self.timer.phase("rollout"):
                groups = self.engine.generate([self.prompt_ids(t) for t in tasks], G, cfg.max_new_tokens,
                                              cfg.temperature, cfg.top_p,
                                              seed=derive_seed(cfg.seed, self.round, step, draw, "sample"))
            with self.timer.phase("reward"):
                return groups, score_tasks([t for t in tasks for _ in range(G)],
                                           [c.text for g in groups for c in g])
        mine = distributed.shard_indices(len(tasks), distributed.rank(), distributed.world_size())
        with self.timer.phase("rollout"):
            if seeding == "prompt":  # a prompt's samples depend on its position only, not on which rank draws them
                my_groups = [self.engine.generate([self.prompt_ids(tasks[i])], G, cfg.max_new_tokens, cfg.temperature,
                                                  cfg.top_p, seed=derive_seed(cfg.seed, self.round, step, draw,
                                                                              "sample", i))[0] for i in mine]
            else:
                my_groups = self.engine.generate([self.prompt_ids(tasks[i]) for i in mine], G, cfg.max_new_tokens,
                                                 cfg.temperature, cfg.top_p,
                                                 seed=derive_seed(cfg.seed, self.round, step, draw, "sample",
                                                                  distributed.rank()))
        with self.timer.phase("reward"):
            my_scores = score_tasks([tasks[i] for i in mine for _ in range(G)],
                                    [c.text for g in my_groups for c in g])
        scored = [(g, my_scores[k * G:(k + 1) * G]) for k, g in enumerate(my_groups)]
        with self.timer.phase("rollout"):  # waiting for the other ranks' groups
            everything = distributed.gather(scored, len(tasks))
        return [g for g, _ in everything], [r for _, rs in everything for r in rs]

    def episode_rollouts(self, tasks: list[Task], step: int, draw: int) -> tuple[list[list[Completion]], list[float]]:
        """G episodes of each task (up to max_turns answers; training/environments/episodes.py), each as one
        completion, and their rewards: the verifier's on the final answer, less `turn_cost` per extra answer."""
        from training.environments import environment_for
        from training.environments.episodes import run_episodes
        from training.evaluation.measure import context_limit
        from training.rewards import score_tasks

        cfg, G = self.cfg, self.cfg.samples_per_prompt
        with self.timer.phase("rollout"):
            planted = planted_attempts(tasks, cfg.environments, cfg.planted_share,
                                       random.Random(derive_seed(cfg.seed, self.round, step, draw, "plant")))
            played = tasks
            if planted is not None and cfg.planted_mirrors:
                played, planted = mirrored_plants(tasks, planted, cfg.environments)
            episodes = run_episodes(
                self.engine, self.fmt, played, lambda t: environment_for(t, cfg.environments), G, cfg.max_turns,
                cfg.max_new_tokens, cfg.temperature, cfg.top_p, max_context=context_limit(self.model),
                turn_seed=lambda turn: derive_seed(cfg.seed, self.round, step, draw, "sample",
                                                   *(() if turn == 1 else ("turn", turn))), planted=planted)
        for t, group in zip(tasks, episodes):
            self._openings[t.id] = group[0].prompt_ids
        flat = [ep for g in episodes for ep in g]
        with self.timer.phase("reward"):
            scores = score_tasks([ep.task for ep in flat], [ep.answers[-1] for ep in flat])
        rewards = [float(r) - cfg.turn_cost * (ep.turns - 1) for r, ep in zip(scores, flat)]
        for ep, r in zip(flat, rewards):
            ep.reward = r
        self._episodes = flat
        completions = [[ep.as_completion() for ep in g] for g in episodes]
        self._first_splits = [None] * len(tasks)
        if cfg.answer_credit == "turn":
            from training.environments.episodes import split_first_answer

            with self.timer.phase("reward"):
                firsts = first_answer_rewards(episodes, [float(r) for r in scores], score_tasks)
            self._first_splits = [None if f is None else
                                  ([split_first_answer(c, ep.answers[0]) for c, ep in zip(cs, group)], f)
                                  for cs, group, f in zip(completions, episodes, firsts)]
        return completions, rewards

    def opening_ids(self, task: Task) -> list[int]:
        """The prompt a group's completions follow: its environment's opening (multi-turn), else the task's."""
        return self._openings.get(task.id) or self.prompt_ids(task)

    def update_chunks(self, kept: list[tuple[Task, list[Completion], list[float]]],
                      adv: torch.Tensor) -> tuple[list[RolloutBatch | PackedGroups], list[bool] | None]:
        """Micro-batches of this rank's share of the kept groups, and which are live (None: all, 1 process).
        Under N ranks every rank ends with the same number of micro-batches: short ones are padded with
        copies of a chunk that count 0 (see policy_update)."""
        cfg = self.cfg

        def chunked(idx: list[int]) -> list[RolloutBatch | PackedGroups]:
            return micro_batches(self.tokenizer, [self.opening_ids(kept[i][0]) for i in idx],
                                 [kept[i][1] for i in idx], adv[idx].flatten(), self.device, cfg.micro_batch_size,
                                 cfg.packed_groups and takes_4d_mask(self.model),
                                 next(self.model.parameters()).dtype,
                                 pair_cost=self.pair_cost)

        if distributed.world_size() == 1:
            return chunked(list(range(len(kept)))), None
        mine = distributed.shard_indices(len(kept), distributed.rank(), distributed.world_size())
        chunks = chunked(mine) if mine else []
        n = distributed.all_reduce_max(len(chunks))
        filler = chunks[0] if chunks else chunked([0])[0]
        return chunks + [filler] * (n - len(chunks)), [True] * len(chunks) + [False] * (n - len(chunks))

    def prompt_ids(self, task: Task) -> list[int]:
        """The task's chat-rendered prompt ids (rendered once per task and kept)."""
        if task.id not in self._prompt_ids:
            self._prompt_ids[task.id] = self.fmt.prompt_ids(task)
        return self._prompt_ids[task.id]

    def step(self, step: int) -> dict[str, float]:
        """Training step `step` (0-based): sample, score, filter, update. Returns its metrics."""
        cfg, t0 = self.cfg, time.monotonic()
        self.timer.reset()
        torch.manual_seed(derive_seed(cfg.seed, self.round, step, "torch"))
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        counts = domain_counts(cfg.domain_weights, sorted(self.pool), cfg.prompts_per_step)

        # 1-4: sample until the batch has enough informative groups (bounded).
        kept: list[tuple[Task, list[Completion], list[float]]] = []
        kept_splits: list[FirstSplit | None] = []  # answer_credit "turn": each kept group's split
        first_rewards: list[float] = []  # and the first answers' rewards of every split group drawn
        domain_rewards: dict[str, list[float]] = defaultdict(list)
        drawn = zero_var = 0
        cut_by_length: list[float] = []
        components: dict[str, list[float]] = defaultdict(list)  # each weighted-reward component, where it applies
        episodes: list[Any] = []
        for draw in range(cfg.max_sampling_batches if cfg.dynamic_sampling else 1):
            rng = random.Random(derive_seed(cfg.seed, self.round, step, draw, "prompts"))
            tasks = pick_prompts(self.pool, counts, self.curriculum if cfg.curriculum else None, rng)
            groups, scores = self.rollouts(tasks, step, draw)
            episodes += self._episodes
            cut_by_length.append(length_cut_share(groups))
            # each weighted-reward component, where it applies (one process; N ranks gather plain rewards)
            for name, values in getattr(scores, "components", {}).items():
                components[name] += [v for v in values if v is not None]
            rewards = torch.tensor(scores, dtype=torch.float32).view(len(tasks), cfg.samples_per_prompt)  # (B, G)
            drawn += len(tasks)
            self.samples_seen += rewards.numel()
            # self._episodes (multi-turn; else empty) holds each task's G episodes in order: a group's first says
            # whether it was planted (a mirrored group plays another task id, so the ids cannot say it)
            planted = {t.id for t, ep in zip(tasks, self._episodes[::cfg.samples_per_prompt]) if ep.planted}
            for t, r in zip(tasks, rewards.tolist()):
                if t.id not in planted:  # a planted group's reward measures repair, not how hard the task is
                    self.curriculum.update(t.domain, t.difficulty, sum(r) / len(r))
                domain_rewards[t.domain] += r
            keep = (algorithms.drop_zero_variance_groups(rewards) if cfg.dynamic_sampling
                    else torch.arange(len(tasks)))  # (K,)
            splits = self._first_splits if cfg.max_turns > 1 else [None] * len(tasks)
            if cfg.dynamic_sampling and any(sp is not None for sp in splits):
                # answer_credit "turn": a split group whose first answers differ is informative too
                keep = torch.tensor(sorted(set(keep.tolist()) | {i for i, sp in enumerate(splits)
                                                                 if sp is not None and max(sp[1]) > min(sp[1])}),
                                    dtype=torch.long)
            # a group the model wrote nothing in (a planted answer whose reply left no room) has nothing to train
            keep = torch.tensor([i for i in keep.tolist() if any(model_wrote(c) for c in groups[i])],
                                dtype=torch.long)
            zero_var += len(tasks) - len(keep)
            kept += [(tasks[i], groups[i], rewards[i].tolist()) for i in keep.tolist()]
            kept_splits += [splits[i] for i in keep.tolist()]
            first_rewards += [r for sp in splits if sp is not None for r in sp[1]]
            if len(kept) >= cfg.min_informative * cfg.prompts_per_step:
                break
        kept, kept_splits = kept[:cfg.prompts_per_step], kept_splits[:cfg.prompts_per_step]

        # 5: the update.
        stats: dict[str, float] = {}
        if kept:
            rewards = torch.tensor([r for _, _, r in kept])  # (K, G)
            adv = algorithms.get_advantage(cfg.advantage)(rewards)  # (K, G)
            if cfg.answer_credit == "final":
                from training.environments.episodes import final_answer_credit

                kept = [(t, [final_answer_credit(c, a) for c, a in zip(g, row)], r)
                        for (t, g, r), row in zip(kept, adv.tolist())]
            elif cfg.answer_credit == "turn":
                kept, adv = turn_credit_rows(kept, kept_splits, adv, algorithms.get_advantage(cfg.advantage),
                                             cfg.dynamic_sampling)
            with self.timer.phase("prepare"):  # laying the groups out as tensors (training.grpo_batches)
                chunks, live = self.update_chunks(kept, adv)
            with self.timer.phase("weight_sync"):
                self.engine.sleep()  # vLLM with sleep mode gives the GPU back to the trainer for the update
            stats = policy_update(self.model, self.ref_model, self.optimizer, chunks, cfg,
                                  tis=use_tis(cfg, self.engine_name), compute_dtype=self.compute_dtype,
                                  trainer=self.trainer, live=live, timer=self.timer)
            with self.timer.phase("weight_sync"):
                self.engine.wake_up()
                synced = self.sync_rollout_weights()
            if synced is not None:
                stats["weight_sync_seconds"] = synced
            self.last_rows = [{"step": step + 1, "domain": t.domain, "difficulty": t.difficulty,
                               "prompt": engine_text(self.engine, self.prompt_ids(t)), "completion": c.text,
                               "finish_reason": c.finish_reason, "reward": r, "advantage": float(a)}
                              for (t, g, rs), ad in zip(kept, adv.tolist())
                              for c, r, a in zip(g, rs, ad)][:cfg.log_samples]
        metrics = {f"reward/{d}": sum(v) / len(v) for d, v in sorted(domain_rewards.items())}
        every = [r for v in domain_rewards.values() for r in v]
        metrics["reward/all"] = sum(every) / max(1, len(every))
        metrics.update({f"reward_component/{name}": sum(v) / len(v) for name, v in sorted(components.items()) if v})
        metrics.update({f"train/{k}": v for k, v in stats.items()})
        metrics.update({"groups_drawn": float(drawn), "groups_kept": float(len(kept)),
                        "zero_variance_frac": zero_var / max(1, drawn), "lr": lr,
                        "rollout/length_cut_frac": sum(cut_by_length) / max(1, len(cut_by_length)),
                        "step_seconds": time.monotonic() - t0})
        if episodes:  # how episodes went: answers per episode, and what ended them; samples for the table
            self.last_episodes = episode_rows(episodes, step + 1, cfg.log_samples)
            metrics["episode/turns_mean"] = sum(ep.turns for ep in episodes) / len(episodes)
            metrics["episode/planted_frac"] = sum(ep.planted for ep in episodes) / len(episodes)
            if first_rewards:  # answer_credit "turn": how the model's own first answers did, in split groups
                metrics["episode/first_answer_reward"] = sum(first_rewards) / len(first_rewards)
            for why in ("environment", "max_turns", "context", "single_turn"):
                metrics[f"episode/ended_by_{why}"] = sum(ep.ended_by == why for ep in episodes) / len(episodes)
        metrics.update(self.timer.metrics())  # time/<phase>_s: where this step's time went
        return metrics


def first_answer_rewards(groups: list[list[Any]], scores: list[float],
                         score: Callable[[list[Task], list[str]], Sequence[float]]) -> list[list[float] | None]:
    """answer_credit "turn": per group of episodes, the verifier's score of each episode's first answer alone
    (`scores`: each episode's final answer's, flat; `score(tasks, answers)`, the verifier, for first answers that
    a later turn replaced), or None where the group is not split: planted (its first answer is not the model's)
    or every episode ended at its first answer (the episode's reward is then the first answer's)."""
    G = len(groups[0]) if groups else 0
    rows = [(g, j) for g, group in enumerate(groups) for j, ep in enumerate(group)
            if ep.turns > 1 and not group[0].planted]
    again = dict(zip(rows, score([groups[g][j].task for g, j in rows],
                                 [groups[g][j].answers[0] for g, j in rows]))) if rows else {}
    return [None if group[0].planted or all(ep.turns == 1 for ep in group)
            else [float(again.get((g, j), scores[g * G + j])) for j in range(len(group))]
            for g, group in enumerate(groups)]


def turn_credit_rows(kept: list[tuple[Task, list[Completion], list[float]]], splits: list[FirstSplit | None],
                     adv: torch.Tensor, advantage: Callable[[torch.Tensor], torch.Tensor],
                     informative_only: bool) -> tuple[list[tuple[Task, list[Completion], list[float]]],
                                                      torch.Tensor]:
    """answer_credit "turn": each kept group with a split (`splits[k]`: each episode as its first answer and the
    rest, training.environments.episodes.split_first_answer, and the first answers' rewards) becomes two groups
    of rows: its first answers, with advantages from their own rewards, and its episodes with the first answers
    masked, keeping the episode's advantages (`adv[k]`). With `informative_only` (dynamic sampling) a part whose
    rewards do not vary is left out, as a flat group would be. Other groups pass as they are. The groups to
    update on and their advantages (K', G)."""
    rows: list[tuple[Task, list[Completion], list[float]]] = []
    advs: list[torch.Tensor] = []
    for (task, group, rewards), split, a in zip(kept, splits, adv):
        if split is None:
            rows.append((task, group, rewards))
            advs.append(a)
            continue
        pairs, first = split
        if not informative_only or max(first) > min(first):
            rows.append((task, [f for f, _ in pairs], first))
            advs.append(advantage(torch.tensor([first]))[0])
        if not informative_only or max(rewards) > min(rewards):
            rows.append((task, [rest for _, rest in pairs], rewards))
            advs.append(a)
    return rows, torch.stack(advs) if advs else adv[:0]


def model_wrote(c: Completion) -> bool:
    """Whether a completion holds any token the model generated (an episode's may all be planted or replies)."""
    return not c.model_mask or any(c.model_mask)


def planted_attempts(tasks: list[Task], environments: dict[str, str], share: float,
                     rng: random.Random) -> list[str | None] | None:
    """For about `share` of the tasks whose environment can plant a first answer (`planted_attempt`), one that
    its environment does not accept (a planted answer that passed would leave the model nothing to answer);
    None for the rest. None when nothing is planted."""
    from training.environments import environment_for

    if share <= 0:
        return None
    out: list[str | None] = [None] * len(tasks)
    for i, task in enumerate(tasks):
        plant = getattr(environment_for(task, environments), "planted_attempt", None)
        if plant is not None and rng.random() < share:
            out[i] = plant(task, rng)
    return rejected(tasks, out, environments)


def mirrored_plants(tasks: list[Task], planted: list[str | None],
                    environments: dict[str, str]) -> tuple[list[Task], list[str | None]]:
    """`planted_mirrors`: each planted task whose environment can mirror it (`mirror_tasks(tasks, programs)`)
    swapped for the mirror built from its planted answer, and that answer swapped for the task's reference (the
    mirror's first attempt, kept only where the mirror's environment rejects it; else the plant stays as it
    was). The tasks and the first answers to play."""
    from training.environments import environment_for

    played, answers = list(tasks), list(planted)
    by_mirror: dict[Callable[..., list[Task | None]], list[int]] = defaultdict(list)  # one batch per function
    for i, (task, answer) in enumerate(zip(tasks, planted)):
        mirror = getattr(environment_for(task, environments), "mirror_tasks", None)
        if answer is not None and task.reference and mirror is not None:
            by_mirror[mirror].append(i)
    swaps: dict[int, Task] = {}
    for mirror, rows in by_mirror.items():
        mirrors = mirror([tasks[i] for i in rows], [planted[i] for i in rows])
        swaps.update({i: m for i, m in zip(rows, mirrors) if m is not None})
    rows = sorted(swaps)
    firsts = rejected([swaps[i] for i in rows], [tasks[i].reference for i in rows], environments)
    for i, first in zip(rows, firsts):
        if first is not None:
            played[i], answers[i] = swaps[i], first
    return played, answers


def rejected(tasks: list[Task], answers: list[str | None], environments: dict[str, str]) -> list[str | None]:
    """Each answer its task's environment does not accept as a first answer (one batch per environment type),
    None where it does, or where there is no answer."""
    from training.environments import Environment, environment_for, step_all

    rows: list[int] = []
    envs: list[Environment] = []
    given: list[str] = []
    for i, (task, answer) in enumerate(zip(tasks, answers)):
        env = environment_for(task, environments)
        if answer is not None and env is not None:
            env.reset(task)
            rows.append(i)
            envs.append(env)
            given.append(answer)
    out: list[str | None] = [None] * len(tasks)
    for i, answer, st in zip(rows, given, step_all(envs, given) if envs else []):
        if not st.done and st.observation is not None:
            out[i] = answer
    return out


def episode_rows(episodes: list[Any], step: int, n: int) -> list[dict[str, Any]]:
    """Up to n sample episodes for the MLflow table: those with most turns first (the repairs), then in order;
    each with every answer, the environment's replies (tool outputs) and the reward."""
    chosen = sorted(range(len(episodes)), key=lambda i: (-episodes[i].turns, i))[:n]
    return [{"step": step, **episodes[i].row(), "reward": episodes[i].reward} for i in sorted(chosen)]


def engine_options(cfg: GRPOConfig, engine_name: str) -> dict[str, Any]:
    if engine_name == "hf":
        return {"batch_size": cfg.rollout_batch_size}
    return {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, "max_model_len": cfg.vllm_max_model_len,
            "enable_prefix_caching": cfg.vllm_prefix_caching, "enable_sleep_mode": cfg.vllm_sleep_mode,
            "tensor_parallel_size": cfg.vllm_tensor_parallel_size, "seed": cfg.seed}


def run_round(ctx: StageContext, round_: int) -> dict[str, Any]:
    cfg: GRPOConfig = ctx.config  # type: ignore[assignment]
    use_remote_sandbox(cfg.sandbox_url)
    device = distributed.local_device(resolve_device(cfg.device))
    world = distributed.world_size()
    prev = "sft" if round_ == 1 else rl_round_stage(round_ - 1)
    if world > 1 and cfg.lora.enabled and cfg.parallel.strategy == "fsdp":
        raise ValueError("rl_round: LoRA with parallel.strategy=fsdp is not supported; use ddp (adapters are small)")
    if world > 1 and cfg.max_turns > 1:
        raise ValueError("rl_round: max_turns > 1 runs in one process for now (episodes are not sharded over "
                         "ranks); use max_turns=1 under torchrun")
    if world > 1 and cfg.vllm_tensor_parallel_size > 1:
        raise ValueError("rl_round: under torchrun each rank runs its own vLLM engine on its own GPU "
                         "(data-parallel engines); vllm_tensor_parallel_size > 1 needs a 1-process stage")

    # Policy (previous stage), the KL reference, tasks. With LoRA the frozen base is stored in the compute
    # precision and, adapters disabled, is the reference; without, the reference is the SFT model (offloadable).
    compute_dtype = resolve_precision(cfg.precision, device)
    model, tokenizer = load_policy(ctx, prev, device, dtype=compute_dtype if cfg.lora.enabled else None)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = None
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
        reference = f"{prev} (the LoRA base, adapters disabled; no second copy)"
    elif cfg.beta:
        ref_model, _ = load_policy(ctx, "sft", torch.device("cpu") if cfg.ref_device == "cpu" else device)
        ref_model.eval().requires_grad_(False)
        reference = f"sft ({'offloaded to cpu' if cfg.ref_device == 'cpu' else 'on ' + str(device)})"
    else:
        reference = "none (beta = 0)"
    limit = prompt_limit(cfg.max_prompt_tokens, model, cfg.max_new_tokens)
    check_memory(model, ref_model, cfg, device, world, limit, resolve_engine(cfg.rollout_engine, device))
    trainer, rollout_model = model, None
    if world > 1:
        import copy

        # FSDP shards the policy in place; the hf engine needs whole weights, so it samples from a replica.
        rollout_model = (copy.deepcopy(model).eval() if cfg.parallel.strategy == "fsdp"
                         and resolve_engine(cfg.rollout_engine, device) == "hf" else None)
        trainer = distributed.wrap(model, cfg.parallel, device)
    rnd = Round.build(cfg, round_, model, tokenizer, ref_model, ctx.tasks("train"), device, trainer=trainer,
                      rollout_model=rollout_model)
    holdout, holdout_dropped = fitting_tasks(rnd.fmt, holdout_subset(ctx.tasks("holdout"), cfg.holdout_per_domain),
                                             limit)
    ctx.progress(f"round {round_}: engine {rnd.engine_name}, precision {rnd.compute_dtype}, lora={cfg.lora.enabled}, "
                 f"reference {reference}, prompts {'chat-rendered' if rnd.fmt.uses_template else 'plain'}, "
                 f"stop ids {rnd.fmt.stop_ids}, {world} rank(s)"
                 f"{' ' + cfg.parallel.strategy if world > 1 else ''}; "
                 f"dropped over {limit} prompt tokens: {rnd.prompts_dropped} train, "
                 f"{holdout_dropped} holdout", prompts_dropped_train=float(rnd.prompts_dropped),
                 prompts_dropped_holdout=float(holdout_dropped))
    ctx.mlflow.set_tags({"posttrain.rollout_engine": rnd.engine_name, "posttrain.reference": reference,
                         "posttrain.lora": str(cfg.lora.enabled), "posttrain.precision": str(rnd.compute_dtype)})

    # Resume, or measure where the round starts.
    start_step, history = 0, []
    state, _ = checkpointing.latest_state(ctx.stage_uri, ctx.workdir)
    if state is not None:
        start_step = checkpointing.restore(state, trainer if state.get("sharded") else model, rnd.optimizer)
        rnd.curriculum.rates = dict(state["extra"]["curriculum"])
        holdout_before = state["extra"]["holdout_before"]
        history = list(state["extra"]["history"])
        rnd.sync_rollout_weights()
        ctx.progress(f"resumed from checkpoint step {start_step}")
    else:
        holdout_before, _ = holdout_check(rnd.engine, holdout, cfg.max_new_tokens, rnd.fmt)
        ctx.progress(f"round {round_} starts from {prev}",
                     **{f"holdout_before/{k}": v for k, v in holdout_before.items()})

    t0 = time.monotonic()
    model.train()
    for step in range(start_step, cfg.steps):
        metrics = rnd.step(step)
        done = step + 1
        metrics.update({f"curriculum/{k}": v for k, v in sorted(rnd.curriculum.rates.items())})
        # history is what a retried round must reproduce: no timings (step, phases) and no memory, which
        # differ run to run; MLflow gets them all
        history.append({"step": done, **{k: v for k, v in metrics.items()
                                          if not k.startswith(("curriculum/", "time/"))
                                          and not k.endswith("_seconds")}})
        ctx.progress("step", step=done, **metrics, **distributed.peak_memory_metrics(device))
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            checkpointing.save(ctx.stage_uri, done, trainer, rnd.optimizer, tokenizer,
                               extra={"curriculum": dict(rnd.curriculum.rates), "holdout_before": holdout_before,
                                      "history": history}, keep_last=cfg.keep_checkpoints)
            ctx.progress(f"checkpoint step {done}")
    elapsed = time.monotonic() - t0

    # End of round: holdout check, samples table, the new policy.
    model.eval()
    holdout_after, holdout_rows = holdout_check(rnd.engine, holdout, cfg.max_new_tokens, rnd.fmt)
    ctx.mlflow.log_metrics({**{f"holdout/{k}": v for k, v in holdout_after.items()},
                            **{f"holdout_delta/{k}": holdout_after[k] - holdout_before.get(k, 0.0)
                               for k in holdout_after}}, step=cfg.steps)
    samples = rnd.last_rows + _holdout_samples(holdout_rows, cfg.log_samples)
    ctx.mlflow.log_table(samples, "samples.json")
    ctx.writer.put_json(samples, "samples.json")
    if rnd.last_episodes:  # multi-turn: turns, tool outputs and reward of sample episodes
        ctx.mlflow.log_table(rnd.last_episodes, "episodes.json")
        ctx.writer.put_json(rnd.last_episodes, "episodes.json")
    final = distributed.gathered_model(trainer, cfg.parallel.weight_sync_bucket_mb)  # None on ranks other than 0
    if final is not None:
        models.save_checkpoint(final, tokenizer, ctx.writer, "model")
    ctx.writer.put_json({"holdout_before": holdout_before, "holdout_after": holdout_after, "history": history},
                        "round_report.json")
    ctx.progress(f"round {round_} done", step=cfg.steps, **{f"holdout/{k}": v for k, v in holdout_after.items()})
    holdout_counts: dict[str, dict[str, int]] = {}
    for row in holdout_rows:
        c = holdout_counts.setdefault(row["domain"], {"passed": 0, "total": 0})
        c["total"] += 1
        c["passed"] += int(row["reward"] > 0)
    rewards = [h["reward/all"] for h in history if "reward/all" in h]
    return {"round": round_, "steps": cfg.steps, "resumed_from": start_step, "policy_from": prev,
            "holdout_before": holdout_before, "holdout_after": holdout_after,
            # holdout counts (the report's per-round plot) and the round's mean train reward (the gate's
            # reward-hacking rule, read by evaluate into report.json's "rounds")
            "holdout": holdout_counts, "train_reward_mean": sum(rewards) / max(1, len(rewards)),
            # the gate's KL and entropy sanity rule: the round's mean KL to the reference and token entropy
            "kl_ref_mean": _mean_of(history, "train/kl_ref"), "entropy_mean": _mean_of(history, "train/entropy"),
            "final_train_metrics": history[-1] if history else {},
            "rollout_engine": rnd.engine_name, "reference": reference, "lora": cfg.lora.enabled,
            "prompts_dropped": {"train": rnd.prompts_dropped, "holdout": holdout_dropped},
            "samples_per_s_this_attempt": rnd.samples_seen / max(elapsed, 1e-9), "world_size": world}


def _mean_of(history: list[dict[str, Any]], key: str) -> float | None:
    values = [float(h[key]) for h in history if key in h]
    return sum(values) / len(values) if values else None


def check_memory(model: Any, ref_model: Any | None, cfg: GRPOConfig, device: torch.device, world: int,
                 prompt_tokens: int, engine_name: str) -> None:
    """Refuse to start when policy, gradients, AdamW state, reference and the rollout KV cache cannot fit a
    rank: an estimate (activations not counted). vLLM holds its KV cache inside its own memory share."""
    if not cfg.parallel.memory_check:
        return
    params = list(model.parameters())
    from training.evaluation.measure import context_limit

    context = int(context_limit(model) or prompt_tokens + cfg.max_new_tokens)
    rows = min(cfg.rollout_batch_size, -(-cfg.prompts_per_step // world) * cfg.samples_per_prompt)
    kv = 0.0 if engine_name != "hf" else distributed.kv_cache_bytes(
        model.config, rows, min(context, prompt_tokens + cfg.max_new_tokens), params[0].element_size())
    estimate = distributed.estimate_memory(
        sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad), params[0].element_size(),
        world, cfg.parallel.strategy,
        reference_params=0 if ref_model is None or cfg.ref_device == "cpu" else models.count_parameters(ref_model),
        kv_cache_bytes=kv)
    capacity = distributed.device_capacity(device)
    if engine_name == "vllm":
        capacity *= 1 - cfg.vllm_gpu_memory_utilization
    distributed.check_fits(estimate, capacity, cfg.parallel.memory_headroom, "rl_round")


def holdout_check(engine: Any, tasks: list[Task], max_new_tokens: int,
                  fmt: PromptFormat) -> tuple[dict[str, float], list[dict]]:
    """holdout_pass_at_1 over all ranks: each greedily decodes its share, the rows are gathered in order and
    the rates computed from all of them (1 process: holdout_pass_at_1 itself)."""
    if distributed.world_size() == 1:
        return holdout_pass_at_1(engine, tasks, max_new_tokens, fmt)
    _, mine = holdout_pass_at_1(engine, distributed.shard(tasks), max_new_tokens, fmt)
    rows = distributed.gather(mine, len(tasks))
    by_domain: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_domain[row["domain"]].append(row["reward"])
    rates = {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rates["all"] = sum(r["reward"] for r in rows) / max(1, len(rows))
    return rates, rows


def _holdout_samples(rows: list[dict], n: int) -> list[dict]:
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(r)
    per = max(1, n // max(1, len(by_domain)))
    return [{"step": "holdout", **r} for d in sorted(by_domain) for r in by_domain[d][:per]]


def cli(argv: list[str], prog: str = "posttrain rl-round") -> int:
    import argparse

    from training.cli import stage_cli

    def round_number(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"--round must be an integer >= 1, got {text!r}")
        return int(text)

    def round_argument(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--round", type=round_number, required=True,
                            help="round number N >= 1 (stage rl_round_N)")

    def bind(args: argparse.Namespace) -> tuple[str, Any]:
        return rl_round_stage(args.round), lambda ctx: run_round(ctx, args.round)

    return stage_cli(argv, prog, "One GRPO round: rollouts, verifier rewards, group-relative policy update.",
                     GRPOConfig, arguments=round_argument, bind=bind)
