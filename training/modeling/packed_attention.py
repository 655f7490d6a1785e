"""Packed rows without a (T, T) mask: attention run per segment, gathered from the row and scattered back.

A packed row holds several sequences back to back (SFT: examples; RL: a prompt and its G completions, each
completion attending to the prompt and to itself). The dense form of that is an (R, 1, T, T) mask, quadratic in
the row's length: at 8k-token rows it is 256 MB a row in fp32 before the attention itself, and SDPA under an
arbitrary mask takes its math kernel, which materialises the (T, T) scores per head.

Here each segment (the positions one sequence attends over, in order) is gathered out of the row into an
(N, heads, S, head_dim) batch, attention runs on it with SDPA's `is_causal` (a memory-efficient kernel on CPU
and CUDA, nothing quadratic stored), and each position's output is scattered back from the segment that owns it
(a prompt shared by G completions: the group's first segment; its outputs are the same in every segment, as the
prompt attends only to itself). Segments are right-padded to the longest; causal attention never lets a real
query see the padding after it. Row positions no segment owns (the row's padding) get zeros.

How it reaches the model: `posttrain_packed` is registered with transformers as an attention implementation.
Without a `packed_segments` keyword it is transformers' own SDPA, masks included, so generation and the padded
layout are unchanged; with one, the model gets a placeholder 4D mask (`mask_placeholder`, which transformers
passes through as "already prepared") and the keyword reaches every layer's attention through the model's
`**kwargs`. A model whose forward drops the keyword would attend over the whole row: the placeholder then
reaches attention alone and is refused, and `enable` checks every model once against the dense mask (`probe`)
before switching it, so a model that cannot take segments keeps the mask and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

NAME = "posttrain_packed"
KEYWORD = "packed_segments"


@dataclass
class PackedSegments:
    """Where each segment's positions lie in the flattened (R*T) packed rows, and where each row position's
    output comes from in the flattened (N*S) segment outputs.

    gather:  (N, S) indices into R*T; a segment shorter than S is padded at its end (any valid index).
    scatter: (R*T,) indices into N*S, or N*S (a zero row) for positions no segment owns.
    """

    gather: torch.Tensor
    scatter: torch.Tensor

    def to(self, device: torch.device | str) -> PackedSegments:
        return PackedSegments(self.gather.to(device), self.scatter.to(device))


def build_segments(segments: list[list[tuple[list[int], list[int]]]], T: int) -> PackedSegments:
    """segments[r]: row r's segments, each (positions it attends over in order, the positions it owns) with
    owned a subset of positions. Returns the gather and scatter indices for R rows of length T."""
    flat = [(r, pos, own) for r, row in enumerate(segments) for pos, own in row]
    N = len(flat)
    S = max(1, max((len(pos) for _, pos, _ in flat), default=1))
    gather = torch.zeros((N, S), dtype=torch.long)
    R = len(segments)
    scatter = torch.full((R * T,), N * S, dtype=torch.long)
    for i, (r, pos, own) in enumerate(flat):
        if not pos:
            continue
        where = torch.tensor(pos, dtype=torch.long)
        gather[i, : len(pos)] = r * T + where
        gather[i, len(pos) :] = r * T + int(where[-1])  # padding after the end: causally invisible
        slot = {p: j for j, p in enumerate(pos)}
        for p in own:
            scatter[r * T + p] = i * S + slot[p]
    return PackedSegments(gather, scatter)


def mask_placeholder(rows: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The (R, 1, 1, 1) stand-in for a packed batch's 4D mask: transformers takes any 4D mask as prepared and
    hands it to attention untouched, where the segments replace it."""
    return torch.zeros((rows, 1, 1, 1), dtype=dtype, device=device)


def _is_placeholder(mask: Any, query: torch.Tensor) -> bool:
    return isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-2:] == (1, 1) and query.shape[2] > 1


def segments_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: (R, heads, T, d) in, (R, T, heads, d) out, as transformers'."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments: PackedSegments | None = kwargs.pop(KEYWORD, None)
    if segments is None:
        if _is_placeholder(attention_mask, query):
            raise RuntimeError(
                "a packed batch's placeholder mask reached attention without its packed_segments: this model's "
                "forward does not pass keywords to attention, so it must keep the dense mask"
            )
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("sliding_window") is not None:  # a window needs the mask; is_causal alone would ignore it
        raise RuntimeError("packed segments do not implement sliding-window attention")
    kwargs.pop("is_causal", None)
    R, _, T, _ = query.shape
    N, S = segments.gather.shape

    def gathered(x: torch.Tensor) -> torch.Tensor:  # (R, h, T, d) -> (N, h, S, d)
        flat = x.transpose(1, 2).reshape(R * T, x.shape[1], x.shape[3])  # (R*T, h, d)
        return flat[segments.gather].transpose(1, 2)

    out, _ = sdpa_attention_forward(
        module, gathered(query), gathered(key), gathered(value), None, is_causal=True, **kwargs
    )  # (N, S, h, d)
    flat = out.reshape(N * S, out.shape[2], out.shape[3])
    flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])  # row N*S: the zeros for unowned positions
    return flat[segments.scatter].view(R, T, out.shape[2], out.shape[3]), None


def register() -> None:
    """Register the implementation (and SDPA's mask builder under its name) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, segments_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def implementation(model: Any) -> str | None:
    """The attention implementation of `model`, or of the module DDP wraps."""
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def takes_segments(model: Any) -> bool:
    """Whether `model` runs packed batches by segments (enable() switched it and its probe passed)."""
    return implementation(model) == NAME


def forward_inputs(
    model: Any,
    what: str,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segments: PackedSegments | None,
) -> dict[str, Any]:
    """The keywords of a forward over packed rows (`segments` None: the dense mask). A batch laid out by
    segments for a model that enable() did not switch is refused, naming `what` it is and the model."""
    inputs: dict[str, Any] = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": attention_mask}
    if segments is None:
        return inputs
    if not takes_segments(model):
        raise ValueError(
            f"{what} laid out by segments reached {type(model).__name__}, whose attention is "
            f"{implementation(model)!r}: switch it with packed_attention.enable() or lay the batch out with "
            "attention='dense'"
        )
    return {**inputs, KEYWORD: segments}


def enable(model: Any) -> bool:
    """Switch an SDPA model to segments attention once its probe passes; True where it did. Eager and
    flash-attention models keep what they have (the dense mask, or the padded layout), and so does a model
    whose probe fails, with a warning naming it."""
    current = implementation(model)
    if current == NAME:
        return True
    if current != "sdpa":
        return False
    register()
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError) as err:
        log.warning("packed attention: %s keeps the dense mask (cannot switch: %s)", type(model).__name__, err)
        return False
    ok, why = probe(model)
    if not ok:
        model.set_attn_implementation(current)
        log.warning("packed attention: %s keeps the dense mask (%s)", type(model).__name__, why)
    return ok


def dense_mask(segments: list[list[tuple[list[int], list[int]]]], T: int, dtype: torch.dtype) -> torch.Tensor:
    """The (R, 1, T, T) additive mask of the same segments (build_segments' argument): the query at a segment's
    j-th position, where the segment owns it, attends to the segment's first j + 1 positions; a position no
    segment owns attends to itself (no all-masked row)."""
    allowed = torch.zeros((len(segments), T, T), dtype=torch.bool)
    for r, row in enumerate(segments):
        owned: set[int] = set()
        for pos, own in row:
            for j, p in enumerate(pos):
                if p in own:
                    allowed[r, p, pos[: j + 1]] = True
            owned.update(own)
        for p in set(range(T)) - owned:
            allowed[r, p, p] = True
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def probe(model: Any, atol: float = 1e-4) -> tuple[bool, str]:
    """Run one small packed batch through the model with the dense mask and with segments; (agree, why not).
    Two rows, each a prompt and two completions as the RL update packs them (a completion attends to its
    prompt and itself; row 1 is padded). Run in eval mode (no dropout) and without gradients."""
    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
    T = 14
    # row 0: prompt 0-4, completions 5-8 and 9-10; row 1: prompt 0-2, completions 3-8 and 9-11; then padding
    spans = [
        [(list(range(0, 9)), list(range(0, 9))), (list(range(0, 5)) + [9, 10], [9, 10])],
        [(list(range(0, 9)), list(range(0, 9))), (list(range(0, 3)) + [9, 10, 11], [9, 10, 11])],
    ]
    position_ids = torch.zeros((2, T), dtype=torch.long)
    for r, row in enumerate(spans):
        for pos, own in row:
            for j, p in enumerate(pos):
                if p in own:
                    position_ids[r, p] = j
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    ids = torch.randint(1, max(2, vocab), (2, T), generator=torch.Generator().manual_seed(0)).to(device)
    position_ids = position_ids.to(device)
    segments = build_segments(spans, T)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            # the dense mask through SDPA's own path: ours without the keyword is transformers' SDPA
            want = model(
                input_ids=ids, position_ids=position_ids, attention_mask=dense_mask(spans, T, dtype).to(device)
            )
            got = model(
                input_ids=ids,
                position_ids=position_ids,
                attention_mask=mask_placeholder(2, dtype, device),
                **{KEYWORD: segments.to(device)},
            )
    except (RuntimeError, ValueError, TypeError) as err:
        return False, f"probe failed: {err}"
    finally:
        model.train(was_training)
    real = (segments.scatter < segments.gather.numel()).view(2, T).to(device)  # row padding is never read
    diff = (want.logits.float() - got.logits.float())[real].abs().max().item()
    if not diff <= atol:
        return False, f"probe: segments and the dense mask differ by {diff:.3g} (> {atol})"
    return True, ""
