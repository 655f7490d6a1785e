"""Token log-probabilities from hidden states, through the output projection a chunk of positions at a time.

At a real vocabulary the logits dominate the update's memory: a full fp32 log-softmax over 8,192 completion
tokens at V = 151,936 is 5 GB for one copy, and autograd keeps it (and the softmax) for the backward. Here the
model runs up to its last hidden state only (`logits_to_keep` selects no position, so the head produces
nothing), and `token_logprobs` computes

    log p(t | h) = (h W^T + b)[t] / tau - logsumexp((h W^T + b) / tau)

for `chunk` positions at a time. Its backward recomputes each chunk's logits (one matmul) instead of keeping
them, so at most one chunk's (chunk, V) fp32 logits are alive at once, forward or backward. The values and
gradients equal the full path's to float rounding (tests/training/modeling/test_chunked_logprobs.py).

    head = output_head(model)            # None: use the model's logits as before
    hidden, _ = final_hidden(trainer, input_ids=..., attention_mask=..., position_ids=...)
    logp = token_logprobs(hidden[sel], targets, head, temperature, chunk=1024)

`trainer` may be the DDP-wrapped model: the forward goes through its hooks as before. A head that is not a
plain `nn.Linear` (LoRA on the head, an FSDP-sharded one) or a model that transforms its logits after the head
(Gemma's soft-capping, Cohere's logit scale) keeps the full path: `output_head` returns None for it.
"""

from __future__ import annotations

from typing import Any

import torch

# config fields that change the logits after the head: a model with any of them set keeps the full path
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def causal_lm(model: Any) -> Any:
    """The transformers CausalLM under DDP (`.module`) and PEFT (`get_base_model`) wrappers."""
    while True:
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def output_head(model: Any) -> torch.nn.Linear | None:
    """The model's output projection when the chunked path can stand in for it exactly, else None."""
    inner = causal_lm(model)
    if any(type(m).__name__.startswith("FSDP") for m in inner.modules()):
        # FSDP2's fully_shard (class FSDP<Model>) reshards and gathers weights around its own forward and
        # reduce-scatters their gradients from its hooks; a head used after that forward is outside both, so a
        # sharded model keeps the full path, and an RL round's reference with it (rl.round.one_logprob_path).
        return None
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear:  # exactly Linear: a LoRA or quantised head computes more than W h + b
        return None
    if type(head.weight) is not torch.nn.Parameter or getattr(head.weight, "device_mesh", None) is not None:
        return None  # an FSDP2 / tensor-parallel DTensor shard: the gather belongs to the wrapper's own forward
    config = getattr(inner, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return head


def final_hidden(model: Any, **inputs: Any) -> tuple[torch.Tensor, Any]:
    """The hidden state the head reads, (N, T, h), and the model's output (its cache), from one forward of
    `model` (the trainer, wrappers and all).

    The forward asks for logits at no position (`logits_to_keep` = an empty index: the head runs on nothing),
    and the decoder's output, which every CausalLM hands its head, is read by a forward hook. Going through
    `model` itself keeps DDP's gradient hooks and gradient checkpointing as they are."""
    inner = causal_lm(model)
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    if decoder is None:
        raise RuntimeError(f"{type(inner).__name__}: no decoder to read the final hidden state from")
    captured: list[torch.Tensor] = []

    def hook(_module: Any, _args: Any, output: Any) -> None:
        captured.append(output[0])  # last_hidden_state, of a ModelOutput or a tuple

    handle = decoder.register_forward_hook(hook)
    try:
        none = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        out = model(**inputs, logits_to_keep=none)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"{type(inner).__name__}: the decoder ran {len(captured)} times in one forward")
    return captured[0], out


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """log softmax((h W^T + b) / tau)[target] for (M, h) hidden states, `chunk` rows at a time; see module doc."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        scale: float,
        chunk: int,
    ) -> torch.Tensor:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # (M,)
        for s in range(0, hidden.shape[0], chunk):
            logits = _logits(hidden[s : s + chunk], weight, bias, scale)  # (c, V) fp32
            out[s : s + chunk] = logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s : s + ctx.chunk]  # (c, h)
            logits = _logits(h, weight, bias, ctx.scale)  # (c, V)
            # d logp[t] / d logits = onehot(t) - softmax, times the 1/tau of the temperature
            g = torch.softmax(logits, dim=-1).mul_(-1.0)  # (c, V)
            g.scatter_add_(-1, targets[s : s + ctx.chunk, None], torch.ones_like(g[:, :1]))
            g.mul_(grad[s : s + ctx.chunk, None] / ctx.scale)
            if grad_h is not None:  # in the head's dtype: an fp32 copy of a bf16 (V, h) weight would be GBs
                grad_h[s : s + ctx.chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(g.t(), h.float())
            if grad_b is not None:
                grad_b += g.sum(0)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """(c, V) fp32 logits / tau of a chunk: the matmul in the head's own dtype, as the model's forward does it."""
    logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()
    return logits / scale if scale != 1.0 else logits


def token_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear, temperature: float = 1.0, chunk: int = 1024
) -> torch.Tensor:
    """log softmax(head(hidden) / temperature) at `targets`. hidden: (..., h), targets: (...) -> (...) fp32.
    No more than `chunk` positions' logits exist at once, in the forward or the backward."""
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # (M, h)
    flat_t = targets.reshape(-1)  # (M,)
    if flat_t.numel() == 0:
        return torch.zeros(shape, dtype=torch.float32, device=hidden.device) + 0.0 * hidden.sum()
    scale = temperature if temperature > 0 else 1.0
    out = _ChunkedTokenLogprobs.apply(flat_h, head.weight, head.bias, flat_t, float(scale), max(1, int(chunk)))
    return out.view(shape)
