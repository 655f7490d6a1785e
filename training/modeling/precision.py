"""Numeric precision and activation memory of a training stage.

`precision: "auto" | "fp32" | "bf16"`: auto is bf16 on a CUDA device that supports it and fp32 elsewhere (CPU
bf16 matmuls are slower than fp32 on most x86 cores). bf16 means autocast: master weights and optimizer state
stay fp32, matmuls run in bf16 (what TRL's `bf16=True` does); a LoRA base, which is frozen, is also stored in
bf16, halving its memory. `gradient_checkpointing` recomputes activations in the backward pass instead of
keeping them (about a third more compute for far less activation memory).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(name: str, device: torch.device) -> torch.dtype:
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r}: use one of {', '.join(PRECISIONS)}")
    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    return torch.bfloat16 if name == "bf16" else torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on `device`, or nothing for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def enable_gradient_checkpointing(model: Any) -> None:
    """Non-reentrant checkpointing: works with frozen inputs (LoRA) without `enable_input_require_grads`."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(model, "config", None) is not None:
        model.config.use_cache = False  # a cache is useless in training and conflicts with checkpointing
