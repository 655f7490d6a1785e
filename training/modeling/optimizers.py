"""The optimizer every training stage uses: AdamW (Loshchilov & Hutter 2019) over the trainable parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def adamw(model: Any, lr: float, betas: Sequence[float], weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the parameters that require grad (LoRA: the adapters only). Decoupled weight decay applies
    to matrices only, not to biases and norm gains (1-D tensors), as in GPT-2/nanoGPT: decaying a gain pulls
    the layer's output scale towards zero for no regularisation benefit."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(betas[0], betas[1]),
    )
