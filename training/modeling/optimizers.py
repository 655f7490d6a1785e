"""The optimizer every training stage uses: AdamW (Loshchilov & Hutter 2019) over the trainable parameters, on
the device or, with `offload`, with its state and an fp32 master copy of the weights in CPU memory.

Where torch has a fused kernel for the parameters (plain CPU or CUDA tensors; not FSDP's DTensor shards) the step
is fused: one pass per parameter with no temporaries. torch's default on CPU is the per-parameter loop, whose
`exp_avg_sq.sqrt() / bias_correction + eps` allocates a copy of each parameter: at a real vocabulary that is the
embedding's and the head's size (155 MB each at V = 151,936, h = 256), on top of the moments the first step
allocates, and it set the peak of a whole SFT step (benchmarks/long_context.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def adamw(
    model: Any, lr: float, betas: Sequence[float], weight_decay: float, offload: bool = False, fused: bool = True
) -> torch.optim.Optimizer:
    """AdamW over the parameters that require grad (LoRA: the adapters only). Decoupled weight decay applies
    to matrices only, not to biases and norm gains (1-D tensors), as in GPT-2/nanoGPT: decaying a gain pulls
    the layer's output scale towards zero for no regularisation benefit. `offload`: CPUOffloadAdamW. `fused`:
    torch's fused kernel where it takes the parameters (`fusable`), else torch's default."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if offload:
        return CPUOffloadAdamW(groups, lr=lr, betas=(betas[0], betas[1]), fused=fused)
    return torch.optim.AdamW(
        groups, lr=lr, betas=(betas[0], betas[1]), fused=(fused and fusable(decay + no_decay)) or None
    )


def fusable(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes every one of `params`: floating-point plain tensors on CPU or
    CUDA. A DTensor (an FSDP2 / tensor-parallel shard) keeps torch's default path."""
    return bool(params) and all(
        type(p) in (torch.Tensor, torch.nn.Parameter)
        and getattr(p, "device_mesh", None) is None
        and p.device.type in ("cpu", "cuda")
        and p.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        for p in params
    )


class CPUOffloadAdamW(torch.optim.Optimizer):
    """AdamW whose state lives in CPU memory, as ZeRO-Offload does (Ren et al. 2021): the device holds the
    weights and their gradients only. A step copies the gradients to fp32 CPU shadows of the weights, runs
    torch's AdamW there, and copies the new weights back. Full fine-tuning with AdamW needs about 16 bytes a
    parameter beside the weights (fp32 master weights and two moments): 128 GB at 8B, more than an 80 GB GPU;
    offloaded, the device needs the bf16 weights and gradients (4 bytes a parameter) and the host the rest.

    The same updates as torch.optim.AdamW on the same weights (tested); `param_groups` are the device
    parameters' (a learning-rate schedule sets them as usual) and the state dict is the CPU optimizer's, so
    checkpoints save and resume as before."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], fused: bool = True) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": 0.0, "eps": 1e-8})
        if any(getattr(p, "device_mesh", None) is not None for g in self.param_groups for p in g["params"]):
            raise ValueError("optimizer_offload: the weights are FSDP shards; use FSDP's own CPU offload instead")
        self.shadows = [[_shadow(p) for p in g["params"]] for g in self.param_groups]
        self.inner = torch.optim.AdamW(
            [{**_hyper(g), "params": s} for g, s in zip(self.param_groups, self.shadows)],
            lr=lr,
            betas=betas,
            fused=(fused and fusable([s for group in self.shadows for s in group])) or None,
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group, inner, shadows in zip(self.param_groups, self.inner.param_groups, self.shadows):
            inner.update(_hyper(group))  # the schedule writes the device groups
            for p, s in zip(group["params"], shadows):
                s.grad = None if p.grad is None else p.grad.detach().to("cpu", torch.float32)
        self.inner.step()
        for group, shadows in zip(self.param_groups, self.shadows):
            for p, s in zip(group["params"], shadows):
                if s.grad is not None:
                    p.copy_(s.to(p.device, p.dtype, non_blocking=True))
                    s.grad = None  # a CPU copy of every gradient between steps would double host memory
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # the weights were restored just before (checkpointing.restore): the shadows start from them again
        with torch.no_grad():
            for group, shadows in zip(self.param_groups, self.shadows):
                for p, s in zip(group["params"], shadows):
                    s.copy_(p.detach().to("cpu", torch.float32))
        self.inner.load_state_dict(state_dict)


def _shadow(p: torch.Tensor) -> torch.Tensor:
    return p.detach().to("cpu", torch.float32, copy=True).requires_grad_(True)


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}
