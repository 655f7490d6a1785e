"""Tensors for the GRPO update: rollout groups laid out for the policy and reference forward passes.

A step's rollouts come in groups: G completions of one prompt. Two layouts give the same log-probs (tested):

- packed (default): one row per group, the prompt once and then its G completions back to back, with a
  block attention mask so that a completion sees the prompt and its own earlier tokens only, and positions
  restarting after the prompt for every completion:

      row:       p0 p1 p2 | a0 a1 a2 | b0 b1 | c0 ...
      positions:  0  1  2 |  3  4  5 |  3  4 |  3 ...

  Nothing is padded inside a group, and the prompt is computed once. RL completions vary ~10x in length
  within a batch, so padding every completion to the longest cost the update about 3x its real tokens. The
  4D mask needs an attention implementation that accepts one (eager or sdpa; not flash-attention-2); a model
  switched by training.modeling.packed_attention takes the same row by segments instead, with no mask.
- padded: one row per completion, [left-padded prompt | right-padded completion]; with group_size G > 1 the
  prompts run once and their KV cache is repeated for the G completions.

`micro_batches` splits a step's groups into micro-batches, of whole groups by completion count or, with a
token budget, of at most that many tokens as laid out (a group may then span micro-batches), ordered by length
so each is padded only to its own longest row; `completion_logprobs` gives log pi(token | prefix) for either layout.

Packing is not free: attention under a 4D mask costs every (query, key) pair of the row, masked or not, and a
packed row is G completions long, so its attention grows with (P + G*L)^2 against G*L*(P+L) padded (by
segments it is G*(P+L)^2/2, causal, and packing nearly always pays). When the
completions of a group are about equally long (long RL completions that all hit the cap), padding wastes
nothing and packing only adds attention, which for long completions can cost more than the padding saved.
Given the model's cost per attention pair (`attention_pair_cost`), `micro_batches` lays each micro-batch out
whichever way costs fewer FLOPs (`packing_pays`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from training.modeling import packed_attention
from training.modeling.chunked_logprobs import final_hidden, output_head, token_logprobs as chunked_token_logprobs
from training.modeling.kv_cache import cache_kwarg, cache_of, select_cache_rows
from training.modeling.packed_attention import PackedSegments
from training.rl import algorithms
from training.rollout import Completion
from training.rollout.base import Prompt, left_pad, prompt_ids


@dataclass
class RolloutBatch:
    """Padded layout: row i is completion i after its prompt."""

    input_ids: torch.Tensor  # (N, P+L) left-padded prompt, then right-padded completion
    attention_mask: torch.Tensor  # (N, P+L)
    completion_mask: torch.Tensor  # (N, L) 1 on completion tokens
    prompt_len: int  # P
    advantages: torch.Tensor  # (N,)
    group_size: int = 1  # G > 1: rows come in groups of G sharing one prompt (computed once, see below)
    engine_logprobs: torch.Tensor | None = None  # (N, L) the rollout engine's log-probs of each token


@dataclass
class PackedGroups:
    """Packed layout: row r is group r (its prompt, then its completions); see the module docstring."""

    input_ids: torch.Tensor  # (R, T)
    position_ids: torch.Tensor  # (R, T)
    # dense: (R, 1, T, T) additive, 0 where a query may attend, dtype-min elsewhere; with segments: the
    # (R, 1, 1, 1) placeholder (training.modeling.packed_attention)
    attention_mask: torch.Tensor
    row_of: torch.Tensor  # (N,) the row holding completion i
    predictor: torch.Tensor  # (N, L) the position whose logits predict completion token j (0 on padding)
    completion_ids: torch.Tensor  # (N, L) right-padded
    completion_mask: torch.Tensor  # (N, L) 1 on completion tokens
    advantages: torch.Tensor  # (N,)
    engine_logprobs: torch.Tensor | None = None  # (N, L) the rollout engine's log-probs of each token
    segments: PackedSegments | None = None  # attention by segments instead of the dense mask


def build_batch(
    tokenizer: Any,
    prompts: Sequence[Prompt],
    completions: list[Completion],
    advantages: torch.Tensor,
    device: torch.device,
    group_size: int = 1,
) -> RolloutBatch:
    """Padded layout. prompts[i] (token ids, or text) is the prompt of completions[i]; with group_size G, rows
    i*G..i*G+G-1 share one prompt."""
    pad = tokenizer.pad_token_id
    p_ids, p_attn = left_pad(prompt_ids(tokenizer, prompts), pad)  # (N, P) x2
    comp, cmask = _right_padded([c.token_ids for c in completions], pad)  # (N, L) x2
    return RolloutBatch(
        input_ids=torch.cat([p_ids, comp], dim=1).to(device),  # (N, P+L)
        attention_mask=torch.cat([p_attn, cmask], dim=1).to(device),  # (N, P+L) environment tokens attended
        completion_mask=(cmask * model_masks(completions, cmask.shape[1])).to(device),  # (N, L) model's only
        prompt_len=p_ids.shape[1],
        advantages=advantages.to(device),  # (N,)
        group_size=group_size,
        engine_logprobs=engine_logprobs(completions, comp.shape[1]).to(device),  # (N, L)
    )


def model_masks(completions: Sequence[Completion], length: int) -> torch.Tensor:
    """(N, L) 1 where the model generated the token, 0 on an episode's environment tokens (and padding is
    masked by the caller's length mask): the loss covers only what the policy chose."""
    out = torch.ones((len(completions), length), dtype=torch.long)  # (N, L)
    for i, c in enumerate(completions):
        if c.model_mask:
            out[i, : len(c.model_mask)] = torch.tensor(c.model_mask[:length], dtype=torch.long)
    return out


def engine_logprobs(completions: Sequence[Completion], length: int) -> torch.Tensor:
    """(N, L) the engine's sampling log-probs, right-padded with 0 (0 where an engine reported none)."""
    out = torch.zeros((len(completions), length), dtype=torch.float32)  # (N, L)
    for i, c in enumerate(completions):
        if c.logprobs:
            out[i, : len(c.logprobs)] = torch.tensor(c.logprobs[:length], dtype=torch.float32)
    return out


def pack_groups(
    prompt_ids: list[list[int]],
    groups: list[list[list[int]]],
    advantages: torch.Tensor,
    pad: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    loss_masks: torch.Tensor | None = None,
    attention: str = "dense",
) -> PackedGroups:
    """Packed layout. prompt_ids[r]: token ids of group r's prompt; groups[r]: its completions' token ids;
    advantages: (N,) in the same (group-major) order as the completions. A multi-turn episode is one
    completion (its turns and the environment's replies back to back, attending causally to all of them);
    `loss_masks` (N, >= L) zeroes the environment's tokens in `completion_mask`.

    attention "dense": the (R, 1, T, T) mask; "segments": no mask, each completion's [prompt | completion]
    positions as one segment (training.modeling.packed_attention; the prompt's outputs come from the group's
    first), for a model packed_attention.enable() switched."""
    if attention not in ("dense", "segments"):
        raise ValueError(f"attention must be 'dense' or 'segments', got {attention!r}")
    lengths = [len(p) + sum(len(c) for c in g) for p, g in zip(prompt_ids, groups)]
    R, T = len(groups), max(1, max(lengths))
    ids = torch.full((R, T), pad, dtype=torch.long)  # (R, T)
    pos = torch.zeros((R, T), dtype=torch.long)  # (R, T)
    dense = attention == "dense"
    allowed = torch.zeros((R, T, T) if dense else (0, 0, 0), dtype=torch.bool)  # (R, T, T) query x key
    spans: list[list[tuple[list[int], list[int]]]] = []  # per row: (positions attended over, positions owned)
    completions = [c for g in groups for c in g]
    comp, cmask = _right_padded(completions, pad)  # (N, L) x2
    row_of = torch.tensor([r for r, g in enumerate(groups) for _ in g], dtype=torch.long)  # (N,)
    predictor = torch.zeros(comp.shape, dtype=torch.long)  # (N, L)
    causal = torch.ones((T, T) if dense else (0, 0), dtype=torch.bool).tril()  # (T, T)
    i = 0
    for r, (prompt, group) in enumerate(zip(prompt_ids, groups)):
        P = len(prompt)
        ids[r, :P] = torch.tensor(prompt, dtype=torch.long)
        pos[r, :P] = torch.arange(P)
        if dense:
            allowed[r, :P, :P] = causal[:P, :P]
        row: list[tuple[list[int], list[int]]] = []
        start = P
        for k, c in enumerate(group):
            L = len(c)
            end = start + L
            ids[r, start:end] = torch.tensor(c, dtype=torch.long)
            pos[r, start:end] = torch.arange(P, P + L)
            if dense:
                allowed[r, start:end, :P] = True
                allowed[r, start:end, start:end] = causal[:L, :L]
            else:
                own = list(range(start, end)) if k else list(range(P)) + list(range(start, end))
                row.append((list(range(P)) + list(range(start, end)), own))
            if L:
                predictor[i, 0] = P - 1  # the prompt's last position predicts every completion's first token
                predictor[i, 1:L] = torch.arange(start, end - 1)
            start, i = end, i + 1
        if dense:
            idle = torch.arange(start, T)
            allowed[r, idle, idle] = True  # padding attends to itself: no all-masked rows (NaN in softmax)
        elif not group:
            row.append((list(range(P)), list(range(P))))
        spans.append(row)
    segments = None
    if dense:
        mask = torch.zeros((R, 1, T, T), dtype=dtype).masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    else:
        mask, segments = packed_attention.mask_placeholder(R, dtype), packed_attention.build_segments(spans, T)
    if loss_masks is not None:
        cmask = cmask * loss_masks[:, : cmask.shape[1]]
    return PackedGroups(
        input_ids=ids.to(device),
        position_ids=pos.to(device),
        attention_mask=mask.to(device),
        row_of=row_of.to(device),
        predictor=predictor.to(device),
        completion_ids=comp.to(device),
        completion_mask=cmask.to(device),
        advantages=advantages.to(device),
        segments=None if segments is None else segments.to(device),
    )


def _right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L) ids padded with `pad` and (N, L) mask, L = the longest (at least 1)."""
    L = max(1, max((len(s) for s in seqs), default=0))
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)  # (N, L)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)  # (N, L)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def completion_logprobs(
    model: Any, batch: RolloutBatch | PackedGroups, temperature: float, chunk_tokens: int = 0
) -> torch.Tensor:
    """log pi(token | prefix) of every completion token, at the sampling temperature. Returns (N, L).

    Either layout equals the plain forward over [prompt | completion] (tested). In the padded layout with
    group_size G > 1 each prompt runs once and its KV cache is repeated for the G completions.

    With `chunk_tokens` > 0 and a plain output head (training.modeling.chunked_logprobs.output_head), the model runs
    to its final hidden state and the head's log-softmax is taken `chunk_tokens` positions at a time, on the
    completion tokens under `completion_mask` only (0 elsewhere, where the loss never looks): no (T, V) logits
    exist. Equal to the full path to float rounding (tested).
    """
    scale = temperature if temperature > 0 else 1.0
    head = output_head(model) if chunk_tokens > 0 else None
    if isinstance(batch, PackedGroups):
        inputs = packed_attention.forward_inputs(
            model, "a packed batch", batch.input_ids, batch.position_ids, batch.attention_mask, batch.segments
        )
        if head is not None:
            hidden, _ = final_hidden(model, **inputs)  # (R, T, h)
            rows = batch.row_of.unsqueeze(-1).expand_as(batch.predictor)  # (N, L)
            return _at_mask(
                batch.completion_mask,
                lambda m: hidden[rows[m], batch.predictor[m]],
                batch.completion_ids,
                head,
                scale,
                chunk_tokens,
            )
        logits = model(**inputs).logits  # (R, T, V)
        # Normalise per position (R*T rows), then pick (row, predicting position, token): never materialises
        # the (N, L, V) logits of every completion, which is ~3x larger (prompts' last position is shared).
        logp = torch.log_softmax(logits.float() / scale, dim=-1)  # (R, T, V)
        return logp[batch.row_of.unsqueeze(-1), batch.predictor, batch.completion_ids]  # (N, L)
    P, G = batch.prompt_len, batch.group_size
    targets = batch.input_ids[:, P:]  # (N, L)
    if G > 1:
        shared = _shared_prompt_outputs(model, batch, head)
        if shared is not None:  # (N, L, V) logits, or (N, L, h) hidden states with a head
            if head is None:
                return algorithms.token_logprobs(shared, targets, scale)  # (N, L)
            return _at_mask(batch.completion_mask, lambda m: shared[m], targets, head, scale, chunk_tokens)
    ids, attn = batch.input_ids, batch.attention_mask  # (N, P+L)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (N, P+L) positions as the rollout engine assigns them
    if head is not None:
        hidden, _ = final_hidden(model, input_ids=ids, attention_mask=attn, position_ids=pos)  # (N, P+L, h)
        predicting = hidden[:, P - 1 : -1]  # (N, L, h)
        return _at_mask(batch.completion_mask, lambda m: predicting[m], targets, head, scale, chunk_tokens)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # (N, P+L, V)
    return algorithms.token_logprobs(logits[:, P - 1 : -1], targets, scale)  # (N, L)


def _at_mask(
    mask: torch.Tensor,
    hidden_at: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    head: torch.nn.Linear,
    scale: float,
    chunk: int,
) -> torch.Tensor:
    """(N, L) log-probs of `targets` where `mask` is set, through `head` in chunks; 0 elsewhere.
    hidden_at(m) gives the (M, h) hidden states predicting the M masked tokens, in mask order."""
    m = mask.bool()  # (N, L)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # (N, L)
    out[m] = chunked_token_logprobs(hidden_at(m), targets[m], head, scale, chunk)  # (M,)
    return out


def _shared_prompt_outputs(model: Any, batch: RolloutBatch, head: torch.nn.Linear | None) -> torch.Tensor | None:
    """Logits predicting each completion token (N, L, V), or with a `head` the hidden states that predict
    them (N, L, h), prompts computed once per group. None if the cache layout is unknown (then the caller does
    the plain forward)."""

    def forward(**inputs: Any) -> tuple[torch.Tensor, Any]:
        if head is not None:
            return final_hidden(model, **inputs)
        out = model(**inputs)
        return out.logits, out

    P, G = batch.prompt_len, batch.group_size
    p_ids, p_attn = batch.input_ids[::G, :P], batch.attention_mask[::G, :P]  # (B, P)
    p_pos = (p_attn.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    prompt_out, out = forward(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, use_cache=True)
    cache = cache_of(out)
    # each prompt's keys/values repeated for its G completions: (B*G, H, P, d) per layer
    if not select_cache_rows(cache, torch.arange(p_ids.shape[0], device=p_ids.device).repeat_interleave(G)):
        return None
    c_ids = batch.input_ids[:, P:]  # (N, L)
    L = c_ids.shape[1]
    c_pos = p_pos[:, -1:].repeat_interleave(G, dim=0) + 1 + torch.arange(L, device=c_ids.device)  # (N, L)
    rest, _ = forward(
        input_ids=c_ids,
        attention_mask=batch.attention_mask,
        position_ids=c_pos,
        use_cache=True,
        **{cache_kwarg(model): cache},
    )  # (N, L, V | h)
    first = prompt_out[:, -1:].repeat_interleave(G, dim=0)  # (N, 1, V | h) predicts completion token 0
    return torch.cat([first, rest[:, :-1]], dim=1)  # (N, L, V | h)


def attention_pair_cost(model: Any) -> float:
    """FLOPs of one (query, key) attention pair over all layers, relative to one token through the model
    (its linear layers and the vocabulary projection): 4*h*layers / (2*params). 0 when the config is unknown."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    if not hidden or not layers:
        return 0.0
    params = sum(p.numel() for p in model.parameters())  # tied embeddings count once: the output projection
    return 4.0 * hidden * layers / (2.0 * max(1, params))


def packing_pays(
    prompt_lens: Sequence[int], completion_lens: Sequence[Sequence[int]], pair_cost: float, segments: bool = False
) -> bool:
    """Whether the packed layout of these groups costs fewer FLOPs than the padded one, in token units:
    packed:  R rows of T = max(P + sum L) tokens; attention under the dense mask T^2 pairs a row (the mask
             hides nothing), by segments N segments of S = max(P + L) tokens, S^2 / 2 pairs each (causal);
    padded:  the prompts once (B x P), then N = B*G rows of L = max(L) tokens attending to P + L keys."""
    R = len(prompt_lens)
    T = max(p + sum(c) for p, c in zip(prompt_lens, completion_lens))
    P = max(prompt_lens)
    L = max(max(c) for c in completion_lens)
    N = sum(len(c) for c in completion_lens)
    if segments:
        S = max(p + max(c) for p, c in zip(prompt_lens, completion_lens))
        packed = R * T + pair_cost * N * S * S / 2
    else:
        packed = R * (T + pair_cost * T * T)
    padded = R * (P + pair_cost * P * P) + N * (L + pair_cost * L * (P + L))
    return packed <= padded


def takes_4d_mask(model: Any) -> bool:
    """Whether the model's attention accepts the packed layout's 4D mask (flash-attention kernels do not)."""
    return packed_attention.implementation(model) in (None, "eager", "sdpa", packed_attention.NAME)


def token_budget_plan(
    prompt_lens: Sequence[int], completion_lens: Sequence[Sequence[int]], budget: int, packed: bool
) -> list[list[tuple[int, list[int]]]]:
    """Micro-batches of at most `budget` tokens as laid out (rows x the longest row, padding included): each is
    a list of (group, its completions in this micro-batch). A group may span micro-batches: its prompt is laid
    out again with each share. Packed, a row is a group's prompt and completions back to back, cut where the
    next completion would pass the budget; padded, a row is one completion after its prompt. Rows are taken
    shortest first, so a micro-batch is padded only to rows about as long as its own. A single row longer than
    the budget gets a micro-batch of its own (nothing is cut)."""
    rows: list[tuple[int, int, int, list[int]]] = []  # (prompt, completion tokens, group, completions)
    for g, (p, lens) in enumerate(zip(prompt_lens, completion_lens)):
        if not packed:
            rows += [(p, n, g, [j]) for j, n in enumerate(lens)]
            continue
        share: list[int] = []
        used = 0
        for j, n in enumerate(lens):
            if share and p + used + n > budget:
                rows.append((p, used, g, share))
                share, used = [], 0
            share.append(j)
            used += n
        rows.append((p, used, g, share))

    def laid_out(members: list[tuple[int, int, int, list[int]]]) -> int:
        """Tokens of these rows as laid out: packed rows are right-padded to the longest; padded rows have their
        prompts left-padded to the longest prompt and their completions right-padded to the longest one."""
        if packed:
            return len(members) * max(p + n for p, n, _, _ in members)
        return len(members) * (max(p for p, _, _, _ in members) + max(n for _, n, _, _ in members))

    plan: list[list[tuple[int, int, int, list[int]]]] = []
    for row in sorted(rows, key=lambda r: (r[0] + r[1], r[2], r[3])):
        if plan and laid_out(plan[-1] + [row]) <= budget:
            plan[-1].append(row)
        else:
            plan.append([row])
    return [[(g, share) for _, _, g, share in members] for members in plan]


def micro_batches(
    tokenizer: Any,
    prompts: Sequence[Prompt],
    groups: list[list[Completion]],
    advantages: torch.Tensor,
    device: torch.device,
    size: int,
    packed: bool = True,
    dtype: torch.dtype = torch.float32,
    pair_cost: float = 0.0,
    max_tokens: int = 0,
    attention: str = "dense",
) -> list[RolloutBatch | PackedGroups]:
    """Split a step's groups (prompts[g] with its completions groups[g]; advantages (N,) group-major) into
    micro-batches. The loss is a sum over completions with one normaliser for the step, so the split and the
    order are free (the accumulated gradient is the whole batch's).

    - `max_tokens` > 0: micro-batches of at most that many tokens as laid out (token_budget_plan); a group may
      span micro-batches. The layout (packed or padded) is chosen once for the step.
    - else about `size` completions (0 = one micro-batch), whole groups only, ordered by length so each is
      padded only to its own longest row.

    With `packed` and a `pair_cost` > 0 (attention_pair_cost), a micro-batch is packed only where that costs
    fewer FLOPs than padding (packing_pays); pair_cost 0 packs every micro-batch. `attention`: how packed
    micro-batches keep completions apart (pack_groups: "dense" mask or "segments")."""
    G = len(groups[0])
    p_ids = prompt_ids(tokenizer, prompts)
    tokens = [[c.token_ids for c in g] for g in groups]

    def pays(chosen: Sequence[int]) -> bool:
        return packed and (
            not pair_cost
            or packing_pays(
                [len(p_ids[g]) for g in chosen],
                [[len(t) for t in tokens[g]] for g in chosen],
                pair_cost,
                segments=attention == "segments",
            )
        )

    plan: list[tuple[list[tuple[int, list[int]]], bool]]  # (pieces, packed)
    if max_tokens > 0:
        layout = pays(range(len(groups)))
        lens = [[len(t) for t in g] for g in tokens]
        plan = [(m, layout) for m in token_budget_plan([len(p) for p in p_ids], lens, max_tokens, layout)]
    else:
        length = [len(p) + (sum(map(len, t)) if packed else max(map(len, t))) for p, t in zip(p_ids, tokens)]
        order = sorted(range(len(groups)), key=lambda g: (length[g], g))
        per = max(1, (size or G * len(groups)) // G)
        plan = []
        for k in range(0, len(groups), per):
            chosen = order[k : k + per]
            plan.append(([(g, list(range(G))) for g in chosen], pays(chosen)))
    out: list[RolloutBatch | PackedGroups] = []
    for pieces, as_packed in plan:
        adv = advantages[[g * G + j for g, share in pieces for j in share]]
        flat = [groups[g][j] for g, share in pieces for j in share]
        batch: RolloutBatch | PackedGroups
        if as_packed:
            longest = max(1, max(len(c.token_ids) for c in flat))
            packed_batch = pack_groups(
                [p_ids[g] for g, _ in pieces],
                [[tokens[g][j] for j in share] for g, share in pieces],
                adv,
                tokenizer.pad_token_id,
                device,
                dtype,
                loss_masks=model_masks(flat, longest),
                attention=attention,
            )
            packed_batch.engine_logprobs = engine_logprobs(flat, packed_batch.completion_ids.shape[1]).to(device)
            batch = packed_batch
        else:
            whole = all(len(share) == G for _, share in pieces)  # the shared-prompt forward needs whole groups
            batch = build_batch(
                tokenizer,
                [p_ids[g] for g, share in pieces for _ in share],
                flat,
                adv,
                device,
                group_size=G if whole else 1,
            )
        out.append(batch)
    return out
