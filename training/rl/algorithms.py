"""The maths of policy-gradient post-training, as pure tensor functions (no models, no I/O).

Advantage estimators, policy losses and KL estimators are registered by name (`@register_advantage("grpo")`,
`@register_policy_loss("clip")`, `@register_kl("k3")`) and looked up with `get_advantage(name)`,
`get_policy_loss(name)`, `get_kl(name)`; registering a different function under a taken name raises. The RL
stage's config knobs `advantage`, `policy_loss` and `kl_estimator` name them, and loss aggregation modes are
the names in LOSS_AGGREGATIONS. To add one: a pure function here, registered, with a test against
hand-computed values. Shapes: B prompts, G samples per prompt (a "group"), T tokens
per completion (right-padded; `mask` is 1 on real completion tokens).

References
- GRPO: Shao et al. 2024, "DeepSeekMath" (group-relative advantages, KL to a reference with the k3 estimator).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training" (drop the std normalisation).
- DAPO: Yu et al. 2025 (token-level loss aggregation; dynamic sampling drops groups whose rewards are all equal).
- PPO: Schulman et al. 2017 (clipped surrogate objective).
- RLOO: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al. 2024, "Back
  to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs" (leave-one-out
  baseline; TRL's RLOOTrainer, verl's `rloo`).
- REINFORCE++: Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and
  Reward Models" (its group-baseline form, OpenRLHF's `reinforce_baseline`, verl's
  `reinforce_plus_plus_baseline`: the group mean subtracted, then normalised over the whole batch).
- GSPO: Zheng et al. 2025, "Group Sequence Policy Optimization" (a sequence-level, length-normalised ratio,
  clipped per sequence; TRL's `importance_sampling_level="sequence"`).
- CISPO: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (the
  clipped importance weight, stop-gradient, times the log-probability: no token leaves the gradient).
- KL estimators k1/k2/k3: J. Schulman, "Approximating KL Divergence" (2020 blog note).
- Truncated importance sampling (TIS) for the rollout engine / trainer mismatch: Yao et al. 2025, "Your
  Efficient RL Framework Secretly Brings You Off-Policy RL Training" (as in verl's rollout correction and TRL's
  `vllm_importance_sampling_correction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

AdvantageFn = Callable[..., torch.Tensor]
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

ADVANTAGES: dict[str, AdvantageFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def _register(table: dict[str, Callable], kind: str, name: str) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        existing = table.get(name)
        if (
            existing is not None
            and existing is not fn
            and (existing.__module__, existing.__qualname__) != (fn.__module__, fn.__qualname__)
        ):
            raise ValueError(f"{kind} {name!r} is already registered to {existing.__module__}.{existing.__qualname__}")
        table[name] = fn
        return fn

    return deco


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    return _register(ADVANTAGES, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    return _register(POLICY_LOSSES, "policy loss", name)


def register_kl(name: str) -> Callable[[Callable], Callable]:
    return _register(KL_ESTIMATORS, "KL estimator", name)


def _lookup(table: dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}")
    return table[name]


def get_advantage(name: str) -> AdvantageFn:
    return _lookup(ADVANTAGES, "advantage estimator", name)


def get_policy_loss(name: str) -> PolicyLossFn:
    return _lookup(POLICY_LOSSES, "policy loss", name)


def get_kl(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return _lookup(KL_ESTIMATORS, "KL estimator", name)


# ----- masked reductions --------------------------------------------------------------------------------------
def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x where mask is 1. x, mask: same shape."""
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 when the mask is empty). x, mask: same shape."""
    denom = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / denom.clamp(min=1)


# ----- advantages ---------------------------------------------------------------------------------------------
@register_advantage("grpo")
def group_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: A[b, g] = (r[b, g] - mean_g r[b]) / (std_g r[b] + eps).

    rewards: (B, G). Returns (B, G). `std` is the unbiased sample std (torch default, as in DeepSeekMath and
    TRL). With normalize_std=False (Dr. GRPO) only the group mean is subtracted.
    """
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    adv = rewards - mean  # (B, G)
    if normalize_std:
        std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)  # (B, 1)
        adv = adv / (std + eps)  # (B, G)
    return adv


@register_advantage("dr_grpo")
def mean_centered_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO: group-mean-centred rewards without std normalisation. rewards: (B, G) -> (B, G)."""
    return group_advantages(rewards, normalize_std=False, eps=eps)


@register_advantage("rloo")
def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: each completion's reward minus the mean of the other G - 1 in its group,
    A[b, g] = r[b, g] - (sum_g' r[b, g'] - r[b, g]) / (G - 1) = G / (G - 1) * (r[b, g] - mean_g r[b]).

    rewards: (B, G), G >= 2. Returns (B, G). An unbiased baseline (it does not depend on the sample it
    scores), not divided by any std."""
    G = rewards.shape[1]
    if G < 2:
        raise ValueError("rloo needs at least 2 samples per prompt (the baseline leaves one out)")
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)  # (B, G)
    return rewards - others


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a group baseline: the group mean subtracted, then the result whitened over the whole
    batch (every group of the step, on every rank), A = (c - mean(c)) / (std(c) + eps) with c = r - mean_g r.

    rewards: (B, G). Returns (B, G). Normalising by the batch's std instead of each group's keeps a group
    whose rewards barely differ from getting unit-sized advantages (GRPO's per-group division does that), which
    Hu et al. find more stable. `std` is the unbiased sample std over the B*G values."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G)
    flat = centred.flatten()  # (B*G,)
    std = flat.std() if flat.numel() > 1 else torch.zeros(())
    return (centred - flat.mean()) / (std + eps)


def zero_variance_groups(rewards: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """Boolean (B,): True where every reward in the group is equal (max - min <= tol): no learning signal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= tol  # (B,)


def drop_zero_variance_groups(rewards: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """Indices (K,) of the groups worth keeping: those whose rewards are not all equal (DAPO dynamic sampling).

    rewards: (B, G). Returns a LongTensor of kept group indices, in order.
    """
    return torch.nonzero(~zero_variance_groups(rewards, tol), as_tuple=False).flatten()  # (K,)


# ----- KL estimators (log-ratio r = log q(x) - log p(x), x ~ p = the current policy) -------------------------
@register_kl("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log p - log q: unbiased, high variance, can be negative. logp, ref_logp: (N, T) -> (N, T)."""
    return logp - ref_logp  # (N, T)


@register_kl("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log p - log q)^2 / 2: biased, low variance, >= 0. (N, T) -> (N, T)."""
    return 0.5 * (logp - ref_logp) ** 2  # (N, T)


@register_kl("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(r) - 1 - r with r = log q - log p: unbiased, low variance, >= 0 (GRPO's choice). (N, T) -> (N, T)."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)  # (N, T)
    return torch.exp(log_ratio) - 1.0 - log_ratio  # (N, T)


# ----- loss aggregation ---------------------------------------------------------------------------------------
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    loss, mask: (N, T).
    - "token-mean": sum over every real token of the batch / number of real tokens (DAPO's token-level loss:
      long completions are not down-weighted relative to short ones).
    - "seq-mean-token-mean": mean over tokens within each sequence, then mean over sequences (original GRPO).
    - "seq-mean-token-sum": sum over tokens within a sequence, mean over sequences.
    """
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-mean":
        per_seq = masked_mean(loss, mask, dim=1)  # (N,)
        return per_seq.mean()
    if mode == "seq-mean-token-sum":
        return masked_sum(loss, mask, dim=1).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGGREGATIONS)}")


# ----- policy losses ------------------------------------------------------------------------------------------
def _weighed_loss(
    per_token: torch.Tensor,
    clipped: torch.Tensor,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What every policy loss ends with: the per-token losses (N, T) times `is_weights` (N, T) when given,
    aggregated by `agg`, and the stats: the share of real tokens whose ratio the clip bound (`clipped`, a
    bool tensor broadcastable to (N, T)) and the approximate KL to the sampling policy (k3 of old vs new)."""
    if is_weights is not None:
        per_token = per_token * is_weights  # (N, T)
    loss = aggregate_loss(per_token, mask, agg)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean(clipped.float().expand_as(mask), mask),
            "approx_kl_old": masked_mean(kl_k3(logp.detach(), old_logp), mask),
        }
    return loss, stats


@register_policy_loss("clip")
def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate: loss_t = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A),
    times is_weights_t (N, T) when given (truncated importance sampling against the rollout engine).

    logp, old_logp, mask: (N, T); advantages: (N,) one per sequence (broadcast over tokens) or (N, T).
    ratio_t = exp(logp_t - old_logp_t). Returns (scalar loss, stats) where stats hold the clip fraction and the
    approximate KL to the sampling policy (k3 of old vs new), both aggregated over real tokens.
    `clip_high > clip_low` is DAPO's "clip-higher".
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N, 1)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T)
    unclipped = ratio * advantages  # (N, T)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages  # (N, T)
    per_token = -torch.minimum(unclipped, clipped)  # (N, T)
    return _weighed_loss(per_token, clipped < unclipped, logp, old_logp, mask, agg, is_weights)


@register_policy_loss("gspo")
def sequence_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: one importance ratio per sequence, the geometric mean of its token ratios,
    s_i = exp(mean_t (logp_i,t - old_logp_i,t)), clipped per sequence:
    loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i), the same value on each of the
    sequence's tokens, then aggregated by `agg` ("seq-mean-token-mean" is the paper's sequence mean; TRL keeps
    its loss_type the same way). The gradient of s_i reaches every token of the sequence through the mean.

    Shapes as `clipped_policy_loss`; advantages (N,) (one per sequence: GSPO's ratio is a sequence's). The
    sequence ratio stays within about 1e-3 of 1 where token ratios do not, so the clip range is the paper's
    (3e-4, 4e-4), not PPO's 0.2: set `clip_low`/`clip_high` accordingly. is_weights (N, T), when given, weigh
    the tokens as in `clipped_policy_loss`."""
    if advantages.dim() == 2:
        advantages = advantages[:, 0]
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # (N, T)
    seq_log_ratio = masked_mean(log_ratio, mask, dim=1)  # (N,)
    ratio = torch.exp(seq_log_ratio).unsqueeze(1)  # (N, 1)
    adv = advantages.unsqueeze(1)  # (N, 1)
    unclipped = ratio * adv  # (N, 1)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv  # (N, 1)
    per_token = (-torch.minimum(unclipped, clipped)).expand_as(logp)  # (N, T)
    return _weighed_loss(per_token, clipped < unclipped, logp, old_logp, mask, agg, is_weights)


@register_policy_loss("cispo")
def clipped_weight_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: loss_t = -sg(clip(ratio_t, 1 - clip_low, 1 + clip_high)) * A * logp_t, ratio_t = exp(logp_t -
    old_logp_t). The importance weight is clipped and carries no gradient; the gradient is the log-probability's,
    so a token whose ratio left the range still contributes (PPO's clip zeroes it), with a bounded weight.

    Shapes as `clipped_policy_loss`. MiniMax-M1 leaves the lower side open (clip_low >= 1 does) and tunes the
    upper; the loss's value is not PPO's (it is a weighted log-likelihood), only its gradient is comparable."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N, 1)
    log_ratio = (logp.detach() - old_logp).clamp(-20.0, 20.0)  # (N, T)
    ratio = torch.exp(log_ratio)  # (N, T)
    weight = ratio.clamp(max(0.0, 1.0 - clip_low), 1.0 + clip_high)  # (N, T), no gradient: from logp.detach()
    per_token = -weight * advantages * logp  # (N, T)
    return _weighed_loss(per_token, weight != ratio, logp, old_logp, mask, agg, is_weights)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    kl_estimator: str = "k3",
    policy_loss: str = "clip",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss + beta * KL(policy || reference), both aggregated the same way.

    logp, old_logp, ref_logp, mask: (N, T); advantages: (N,). ref_logp may be None when beta == 0.
    is_weights (N, T): per-token importance weights on the policy-gradient term (see `truncated_is_weights`).
    """
    pg, stats = get_policy_loss(policy_loss)(
        logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high, agg=agg, is_weights=is_weights
    )
    loss = pg
    if beta and ref_logp is not None:
        kl = get_kl(kl_estimator)(logp, ref_logp)  # (N, T)
        kl_term = aggregate_loss(kl, mask, agg)
        loss = pg + beta * kl_term
        stats["kl_ref"] = kl_term.detach()
    stats["pg_loss"] = pg.detach()
    return loss, stats


def truncated_is_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """w_t = min(pi_trainer(y_t) / pi_engine(y_t), cap), no gradient. (N, T) -> (N, T).

    The engine (vLLM, other kernels, maybe bf16) samples from a slightly different distribution than the trainer
    computes; weighting each token's policy gradient by the ratio makes the update unbiased for the trainer's
    policy, and truncating at `cap` bounds the variance (TIS, Yao et al. 2025; verl and TRL use cap 2)."""
    log_ratio = (trainer_logp.detach() - engine_logp).clamp(max=math.log(cap))  # (N, T)
    return torch.exp(log_ratio)  # (N, T)


def mismatch_kl(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(engine || trainer) on the engine's samples, k3 estimator, averaged over real tokens: how far the
    rollout engine's distribution is from the trainer's (logged every step)."""
    return masked_mean(kl_k3(engine_logp, trainer_logp.detach()), mask)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at targets. logits: (N, T, V), targets: (N, T) -> (N, T)."""
    logits = logits.float() / temperature  # (N, T, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, T)
