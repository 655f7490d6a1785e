"""The policy update of one GRPO step: reference and policy log-probabilities, truncated importance sampling
against the rollout engine's log-probs, the loss over micro-batches with gradient accumulation, the optimizer step.

    stats = policy_update(model, ref_model, optimizer, chunks, cfg, tis=use_tis(cfg, engine_name))

`chunks` are the micro-batches of `training.rl.grpo_batches` (padded rows or packed groups); the loss maths is
`training.rl.algorithms.grpo_loss`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from training.modeling import distributed
from training.modeling.lora import is_lora, reference_mode
from training.modeling.precision import autocast
from training.phases import PhaseTimer
from training.rl import algorithms
from training.rl.config import GRPOConfig
from training.rl.grpo_batches import PackedGroups, RolloutBatch, completion_logprobs


def reference_logprobs(
    model: Any, ref_model: Any | None, chunk: RolloutBatch | PackedGroups, temperature: float, chunk_tokens: int = 0
) -> torch.Tensor:
    """log-probs under the KL reference: `ref_model` (on whatever device it lives), or with LoRA the policy's
    own base with adapters disabled. (n, L)."""
    if ref_model is None:
        with reference_mode(model):
            return completion_logprobs(model, chunk, temperature, chunk_tokens)
    ref_device = next(ref_model.parameters()).device
    here = chunk.completion_mask.device
    if ref_device != here:  # an offloaded reference: run its forward where it lives
        moved = dataclasses.replace(
            chunk,
            **{
                f.name: getattr(chunk, f.name).to(ref_device)
                for f in dataclasses.fields(chunk)
                if isinstance(getattr(chunk, f.name), torch.Tensor)
            },
        )
        return completion_logprobs(ref_model, moved, temperature, chunk_tokens).to(here)
    return completion_logprobs(ref_model, chunk, temperature, chunk_tokens)


def use_tis(cfg: GRPOConfig, engine_name: str) -> bool:
    """Whether the update corrects for the engine/trainer mismatch (`rollout_correction`: "auto" is TIS with vLLM)."""
    return cfg.rollout_correction == "tis" or (cfg.rollout_correction == "auto" and engine_name == "vllm")


def policy_update(
    model: Any,
    ref_model: Any | None,
    optimizer: torch.optim.Optimizer,
    chunks: Sequence[RolloutBatch | PackedGroups],
    cfg: GRPOConfig,
    tis: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    trainer: Any | None = None,
    live: Sequence[bool] | None = None,
    timer: PhaseTimer | None = None,
) -> dict[str, float]:
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
            ref_logp = (
                [reference_logprobs(model, ref_model, c, cfg.temperature, cfg.logprob_chunk_tokens) for c in chunks]
                if has_ref
                else None
            )  # [(n, L_c)]
        with timer.phase("policy"):
            old_logp = (
                [completion_logprobs(trainer, c, cfg.temperature, cfg.logprob_chunk_tokens) for c in chunks]
                if cfg.updates_per_batch > 1
                else None
            )  # [(n, L_c)]
    n_tokens = torch.stack([c.completion_mask.sum() for c in chunks]).sum().clamp(min=1)
    n_seqs = sum(c.completion_mask.shape[0] for c in chunks)
    if world > 1:  # global normalisers, from the live chunks of every rank
        n_tokens = torch.tensor(
            distributed.sum_over_ranks(sum(float(c.completion_mask.sum()) * w for c, w in zip(chunks, weight))),
            device=device,
        ).clamp(min=1)
        n_seqs = int(distributed.sum_over_ranks(sum(c.completion_mask.shape[0] * w for c, w in zip(chunks, weight))))
    stats: dict[str, float] = defaultdict(float)
    for _ in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        with timer.phase("policy"):  # forward and backward of every micro-batch
            for j, c in enumerate(chunks):
                mask = c.completion_mask.float()  # (n, L_c)
                with autocast(device, compute_dtype):
                    logp = completion_logprobs(trainer, c, cfg.temperature, cfg.logprob_chunk_tokens)  # (n, L_c)
                old = old_logp[j] if old_logp is not None else logp.detach()  # (n, L_c)
                weights = None
                if tis and c.engine_logprobs is not None:
                    weights = algorithms.truncated_is_weights(old, c.engine_logprobs, cfg.tis_cap)  # (n, L_c)
                loss, st = algorithms.grpo_loss(
                    logp,
                    old,
                    ref_logp[j] if ref_logp is not None else None,
                    c.advantages,
                    mask,
                    beta=cfg.beta,
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    agg=cfg.loss_agg,
                    kl_estimator=cfg.kl_estimator,
                    policy_loss=cfg.policy_loss,
                    is_weights=weights,
                )
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
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            )
            optimizer.step()
        stats["grad_norm"] += distributed.scalar(grad_norm) / cfg.updates_per_batch
    if world > 1:  # each rank's stats are its share of the global ones; the norm is already global
        norm = stats.pop("grad_norm")
        stats = defaultdict(float, distributed.all_reduce_sum(stats))
        stats["grad_norm"] = norm
    return dict(stats)
