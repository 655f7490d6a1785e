"""The RL round's start-up memory check: refuse to start a round that cannot fit a rank, before any work."""

from __future__ import annotations

from typing import Any

import torch

from training.modeling import distributed, models
from training.rl.config import GRPOConfig


def check_memory(
    model: Any,
    ref_model: Any | None,
    cfg: GRPOConfig,
    device: torch.device,
    world: int,
    prompt_tokens: int,
    engine_name: str,
) -> None:
    """Refuse to start when policy, gradients, AdamW state, reference and the rollout KV cache cannot fit a
    rank: an estimate (activations not counted). vLLM holds its KV cache inside its own memory share."""
    if not cfg.parallel.memory_check:
        return
    params = list(model.parameters())
    context = int(models.context_limit(model) or prompt_tokens + cfg.max_new_tokens)
    rows = min(cfg.rollout_batch_size, -(-cfg.prompts_per_step // world) * cfg.samples_per_prompt)
    kv = (
        0.0
        if engine_name != "hf"
        else distributed.kv_cache_bytes(
            model.config, rows, min(context, prompt_tokens + cfg.max_new_tokens), params[0].element_size()
        )
    )
    estimate = distributed.estimate_memory(
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
        params[0].element_size(),
        world,
        cfg.parallel.strategy,
        reference_params=0 if ref_model is None or cfg.ref_device == "cpu" else models.count_parameters(ref_model),
        kv_cache_bytes=kv,
    )
    capacity = distributed.device_capacity(device)
    if engine_name == "vllm":
        capacity *= 1 - cfg.vllm_gpu_memory_utilization
    distributed.check_fits(estimate, capacity, cfg.parallel.memory_headroom, "rl_round")
