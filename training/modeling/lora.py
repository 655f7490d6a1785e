"""LoRA adapters (Hu et al. 2021) through peft, for SFT and RL.

With LoRA the base weights stay frozen, so the base model with its adapters disabled *is* the round's
reference policy: the KL term needs no second copy of the model (`reference_mode`, used as
`with reference_mode(model): ...`). Saved models are merged into plain weights, and a rollout engine that
serves plain weights (vLLM) gets them merged the same way (`merged_state_dict`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LoraSettings:
    """LoRA through peft.

    enabled:        train adapters only; the base weights are frozen.
    r, alpha:       rank and scale numerator (effective scale alpha / r).
    dropout:        on the adapter input.
    target_modules: "all-linear" (every linear layer but the output head, as QLoRA and TRL recommend) or a list
                    of module names (Qwen2/Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
                    down_proj; GPT-2: c_attn, c_proj, c_fc).
    """

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Wrap `model` with fresh adapters (B = 0, so the wrapped model starts equal to the base)."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    return get_peft_model(
        model,
        LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
            fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2",
        ),
    )


@contextlib.contextmanager
def reference_mode(model: Any) -> Iterator[None]:
    """Inside, a LoRA model computes as its frozen base (adapters disabled); a plain model is unchanged."""
    if is_lora(model):
        with model.disable_adapter():
            yield
    else:
        yield


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The weights a plain (non-peft) copy of `model` would have: adapters merged in, peft's names undone.
    For a plain model, its own state dict."""
    if not is_lora(model):
        return dict(model.state_dict())
    model.merge_adapter()
    try:
        out = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            out[plain] = tensor.detach().clone()
        return out
    finally:
        model.unmerge_adapter()
