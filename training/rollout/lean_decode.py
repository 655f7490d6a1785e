"""A lean decode step for Llama-family models (Llama, Qwen2, Qwen3, Mistral) and GPT-2 (the tiny profile's
model): one new token per row through the model's own weights, without transformers' per-call machinery.

Why: at the sizes the rollout loop runs on a CPU (and for small models on a GPU), a cached decode step of
`model(...)` spends more time in bookkeeping than in arithmetic: building the 4-D causal mask, dispatching the
attention interface, growing the cache, returning output objects. This does the same arithmetic with ~30
tensor ops per layer: q/k/v in one matmul (weights concatenated once per rollout, for small models), rotary
embeddings from the model's own `inv_freq`, grouped-query attention (one SDPA call, a group's query heads as
its query positions) straight against a preallocated key/value buffer (no repeated heads, no copy of the cache
per token), the 2-D padding mask applied directly.

The prompt is still prefilled by the model's own forward (any length, any attention implementation), and its
cache is copied into the buffers; only the per-token steps take this path. A decoder lives for one rollout
chunk and reads the weights (or concatenates q/k/v) when it is made, so it decodes with the weights the trainer
holds at that moment. `LeanDecoder.supports(model)` says whether a model is one
it knows: the exact module layout of these architectures, plain `nn.Linear` projections (a LoRA-wrapped or
quantised layer is not), no sharded parameters, rotary embeddings that do not change with the length, no
sliding window shorter than the rollout. Anything else keeps the model's own forward.

The norms are the model's own modules; the rest follows transformers' modelling code; the logits agree with
`model(...)` to float rounding (tested). `lean_decoder(model, cache, mask, length)` picks the decoder for a
model (`LeanDecoder` or `GPT2LeanDecoder`), or None.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load time (not "dynamic")
FUSE_MAX_BYTES = 64 * 1024 * 1024  # fused q/k/v copies up to this size (all layers together)


def _rope_type(config: Any) -> str:
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if isinstance(params, dict):
            return str(params.get("rope_type", params.get("type", "default")))
    return "default"


class LeanDecoder:
    """Decode state for one rollout chunk: the key/value buffers (A, H_kv, T, d) per layer, the padding mask
    (A, T) and the fused q/k/v weights. Build it from the prefilled cache with `from_cache`, then call `step` once per
    new token and `keep` when rows finish."""

    @staticmethod
    def supports(model: Any, total_len: int = 0) -> bool:
        config = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if config is None or inner is None or getattr(config, "model_type", None) not in ARCHITECTURES:
            return False
        if type(model).__name__ not in (f"{n}ForCausalLM" for n in ("Llama", "Qwen2", "Qwen3", "Mistral")):
            return False  # a peft wrapper or any other head
        if _rope_type(config) not in _STATIC_ROPE or getattr(config, "hidden_act", "silu") != "silu":
            return False
        window = getattr(config, "sliding_window", None)
        if config.model_type == "mistral":  # Mistral applies its window to every layer, whatever layer_types says
            uses_window = True
        else:  # Qwen2/Qwen3: only where use_sliding_window made some layers "sliding_attention"
            uses_window = getattr(config, "use_sliding_window", True) and any(
                t == "sliding_attention" for t in getattr(config, "layer_types", None) or ["sliding_attention"]
            )
        if window and uses_window and window < total_len:
            return False
        if getattr(model, "hf_device_map", None):  # dispatched by accelerate: weights behind hooks, maybe offloaded
            return False
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if any(type(m) is not torch.nn.Linear for m in linears):
                return False
        return _plain_weights(model) and type(model.lm_head) is torch.nn.Linear

    def __init__(
        self, model: Any, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, length: int
    ) -> None:
        """keys/values: per layer (A, H_kv, P, d), the prefilled prompt; mask: (A, P) bool, False on padding;
        length: room for this many new tokens."""
        inner = model.model
        self.model, self.inner = model, inner
        self.layers = list(inner.layers[: model.config.num_hidden_layers])
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.scaling = first.scaling
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.float()  # (d/2,)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._buffers(keys, values, mask, length)
        self.fuse()

    def _buffers(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, length: int) -> None:
        """The key/value buffers (A, H_kv, P + length, d) per layer holding the prompt's, and the mask (A, T)."""
        A, P = mask.shape
        self.filled = P
        total = P + length
        self.k = [k.new_empty((A, self.kv_heads, total, self.head_dim)) for k in keys]  # (A, H_kv, T, d)
        self.v = [v.new_empty((A, self.kv_heads, total, self.head_dim)) for v in values]
        for buf, src in zip(self.k + self.v, keys + values):
            buf[:, :, :P] = src
        self.mask = torch.zeros((A, total), dtype=torch.bool, device=mask.device)  # (A, T)
        self.mask[:, :P] = mask.bool()

    @classmethod
    def from_cache(cls, model: Any, cache: Any, mask: torch.Tensor, length: int) -> LeanDecoder | None:
        """From a transformers cache with per-layer `keys`/`values` (A, H_kv, P, d); None for another layout."""
        layers = getattr(cache, "layers", None)
        if not layers or not all(isinstance(getattr(layer, "keys", None), torch.Tensor) for layer in layers):
            return None
        keys, values = [layer.keys for layer in layers], [layer.values for layer in layers]
        if any(k.dim() != 4 or k.shape[-2] != mask.shape[1] for k in keys):
            return None
        return cls(model, keys, values, mask, length)

    def fuse(self) -> None:
        """Concatenate each layer's q/k/v weights (and biases), where that is cheap: one matmul instead of three
        saves per-call overhead, which is what small models are bound by on a CPU. Gate and up stay apart: their
        fused weight is larger than a core's cache, and one matmul over it ran slower than two. Larger models
        (FUSE_MAX_BYTES) keep q/k/v apart too, rather than hold a second copy of those weights."""
        self.fused: list[tuple[torch.Tensor, torch.Tensor | None] | None] = []
        weights = [
            m.weight
            for layer in self.layers
            for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
        ]
        if sum(w.numel() * w.element_size() for w in weights) > FUSE_MAX_BYTES:
            self.fused = [None] * len(self.layers)
            return
        for layer in self.layers:
            attn = layer.self_attn
            self.fused.append(_concat((attn.q_proj, attn.k_proj, attn.v_proj)))

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (A',) of the batch (finished rows leave)."""
        for i in range(len(self.k)):  # a layer at a time: never the whole buffer twice
            self.k[i] = self.k[i].index_select(0, rows)
            self.v[i] = self.v[i].index_select(0, rows)
        self.mask = self.mask.index_select(0, rows)

    def _next_slot(self) -> tuple[int, torch.Tensor]:
        """Open the buffers' next position t for this step: (t, the attention mask (A, 1, 1, t + 1))."""
        t = self.filled
        if t >= self.mask.shape[1]:
            raise RuntimeError(f"lean decode: the buffers hold {t} tokens and are full")
        self.mask[:, t] = True
        return t, self.mask[:, None, None, : t + 1]

    def _append(self, layer: int, t: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values (A, H_kv, d) at position t of a layer's buffers; the filled part
        (A, H_kv, t + 1, d) of each."""
        self.k[layer][:, :, t] = k
        self.v[layer][:, :, t] = v
        return self.k[layer][:, :, : t + 1], self.v[layer][:, :, : t + 1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (A,), positions (A,) their rotary positions; returns the next-token logits (A, V)."""
        A, (t, mask) = tokens.shape[0], self._next_slot()
        h = self.inner.embed_tokens(tokens)  # (A, D)
        freqs = positions.float()[:, None] * self.inv_freq  # (A, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (A, d)
        cos = (emb.cos() * self.rope_scale).to(h.dtype)[:, None, :]  # (A, 1, d)
        sin = (emb.sin() * self.rope_scale).to(h.dtype)[:, None, :]
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        groups = hq // hk
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            fused = self.fused[i]
            x = layer.input_layernorm(h)
            if fused is not None:
                qkv = F.linear(x, fused[0], fused[1])  # (A, (hq + 2 hk) d)
                q = qkv[:, : hq * d].view(A, hq, d)
                k = qkv[:, hq * d : (hq + hk) * d].view(A, hk, d)
                v = qkv[:, (hq + hk) * d :].view(A, hk, d)
            else:
                q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(A, hq, d)
                k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(A, hk, d)
                v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(A, hk, d)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin  # (A, hq, d)
            k = k * cos + _rotate_half(k) * sin  # (A, hk, d)
            keys, vals = self._append(i, t, k, v)  # (A, hk, T', d)
            # grouped-query attention without repeating heads: a group's query heads are the "query positions"
            # of its one key/value head (measured ~20% faster on a CPU than enable_gqa or explicit matmuls)
            out = F.scaled_dot_product_attention(
                q.view(A, hk, groups, d), keys, vals, attn_mask=mask, scale=self.scaling
            ).reshape(A, hq * d)  # (A, hq d)
            h = h + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = layer.post_attention_layernorm(h)
            mlp = layer.mlp
            gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)  # (A, I)
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)  # (A, I)
            h = h + F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight, layer.mlp.down_proj.bias)
        self.filled = t + 1
        h = self.inner.norm(h)
        return F.linear(h, self.model.lm_head.weight, self.model.lm_head.bias)  # (A, V)


class GPT2LeanDecoder(LeanDecoder):
    """The same decode state for GPT-2 (the tiny profile's model): learned position embeddings instead of rotary
    ones, LayerNorm, one fused q/k/v projection already (`c_attn`), `Conv1D` projections (x @ W + b, applied
    here with the same `addmm` as the module, so the logits match the model's to the bit in practice), every
    head its own key/value head."""

    @staticmethod
    def supports(model: Any, total_len: int = 0) -> bool:
        config = getattr(model, "config", None)
        inner = getattr(model, "transformer", None)
        if config is None or inner is None or getattr(config, "model_type", None) != "gpt2":
            return False
        if type(model).__name__ != "GPT2LMHeadModel" or type(model.lm_head) is not torch.nn.Linear:
            return False  # a peft wrapper or any other head
        if (
            config.add_cross_attention
            or config.scale_attn_by_inverse_layer_idx
            or config.reorder_and_upcast_attn
            or total_len > config.n_positions
            or getattr(model, "hf_device_map", None)
        ):
            return False
        from transformers.pytorch_utils import Conv1D

        for block in inner.h:
            if any(
                type(m) is not Conv1D for m in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
            ):
                return False  # LoRA or quantised layers
        return _plain_weights(model)

    def __init__(
        self, model: Any, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, length: int
    ) -> None:
        inner = model.transformer
        self.model, self.inner = model, inner
        self.layers = list(inner.h)
        first = self.layers[0].attn
        self.heads = self.kv_heads = first.num_heads
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self._buffers(keys, values, mask, length)
        self.fuse()

    def fuse(self) -> None:
        self.fused = []  # c_attn is one projection already

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (A,), positions (A,) their position ids; returns the next-token logits (A, V)."""
        A, (t, mask) = tokens.shape[0], self._next_slot()
        h = self.inner.wte(tokens) + self.inner.wpe(positions)  # (A, D)
        H, d = self.heads, self.head_dim
        for i, block in enumerate(self.layers):
            attn, mlp = block.attn, block.mlp
            x = block.ln_1(h)
            qkv = torch.addmm(attn.c_attn.bias, x, attn.c_attn.weight)  # (A, 3 H d), as Conv1D computes it
            q, k, v = qkv.view(A, 3, H, d).unbind(1)  # (A, H, d) each
            keys, vals = self._append(i, t, k, v)  # (A, H, T', d)
            out = F.scaled_dot_product_attention(q[:, :, None], keys, vals, attn_mask=mask, scale=self.scaling).reshape(
                A, H * d
            )  # (A, H d)
            h = h + torch.addmm(attn.c_proj.bias, out, attn.c_proj.weight)
            x = block.ln_2(h)
            h = h + torch.addmm(
                mlp.c_proj.bias, mlp.act(torch.addmm(mlp.c_fc.bias, x, mlp.c_fc.weight)), mlp.c_proj.weight
            )
        self.filled = t + 1
        h = self.inner.ln_f(h)
        return F.linear(h, self.model.lm_head.weight, self.model.lm_head.bias)  # (A, V)


def lean_decoder(model: Any, cache: Any, mask: torch.Tensor, length: int) -> LeanDecoder | None:
    """The lean decoder for `model` built from its prefilled cache (mask (A, P), room for `length` new tokens), or
    None when the model or the cache is not one it knows (the caller keeps the model's own forward)."""
    total = mask.shape[1] + length
    for kind in (LeanDecoder, GPT2LeanDecoder):
        if kind.supports(model, total):
            return kind.from_cache(model, cache, mask, length)
    return None


def _plain_weights(model: Any) -> bool:
    """Every weight a whole tensor on one device: not an FSDP shard (DTensor), not on meta, not split over devices
    (the step reads every weight where the hidden state is)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()  # type: ignore[assignment,misc]
    devices = set()
    for p in model.parameters():
        if isinstance(p, DTensor) or p.device.type == "meta":
            return False
        devices.add(p.device)
    return len(devices) <= 1


def _concat(linears: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias, if any layer has one) stacking the layers' outputs."""
    weight = torch.cat([m.weight for m in linears]).detach()
    if all(m.bias is None for m in linears):
        return weight, None
    return weight, torch.cat(
        [m.bias if m.bias is not None else weight.new_zeros(m.out_features) for m in linears]
    ).detach()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
