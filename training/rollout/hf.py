"""Rollouts with transformers models: batched, KV-cached decoding of left-padded prompts. CPU or GPU.

Two implementations with the same results for greedy decoding (tested): `impl="loop"` (default), a plain
decode loop over the model's forward with its KV cache (`past_key_values`), and `impl="generate"`, transformers'
`model.generate`. For small models the loop is faster: generate's per-token bookkeeping (logits processors,
stopping criteria, input preparation) costs more than the forward pass itself. For Llama-family models (Llama,
Qwen2, Qwen3, Mistral) and GPT-2 the loop's per-token steps go through `training.rollout.lean_decode` (the same
arithmetic without transformers' per-call machinery, against a preallocated key/value buffer; `lean=False` turns
it off), with the same rollouts. `benchmarks/qwen2.py --parts rollout` measures the loop against `generate`
(docs/results.md).

The engine shares the trainer's model object, so `update_weights` is only needed when the weights come from
elsewhere (a state dict or a saved folder). Sampling is seeded: the same (prompts, n_samples, seed) on the same
weights give the same completions, and the global torch RNG is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from training.modeling.kv_cache import cache_kwarg, cache_of, reserve_cache, select_cache_rows
from training.rollout.base import Completion, Prompt, left_pad, prompt_ids
from training.rollout.lean_decode import lean_decoder


class HFRolloutEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 256,
        device: str | None = None,
        impl: str = "loop",
        stop_ids: Sequence[int] | None = None,
        lean: bool = True,
    ) -> None:
        if impl not in ("loop", "generate"):
            raise ValueError(f"impl {impl!r}: use 'loop' or 'generate'")
        self.impl = impl
        self.lean = lean  # the loop's per-token steps through LeanDecoder where the architecture allows
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids) if stop_ids else [tokenizer.eos_token_id]
        self.batch_size = batch_size  # sequences (prompt x sample) per generate call
        self.device = torch.device(device) if device else next(model.parameters()).device

    # The transformers engine shares the trainer's model object: nothing to offload, nothing to sync.
    last_sync_s = 0.0

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def update_weights(self, state_dict_or_path: Any) -> None:
        if isinstance(state_dict_or_path, (str, Path)):
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(str(state_dict_or_path))
            state = loaded.state_dict()
        else:
            state = state_dict_or_path
        self.model.load_state_dict(state, strict=False)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Prompt],
        n_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[list[Completion]]:
        tok = self.tokenizer
        stops, pad = torch.tensor(self.stop_ids, device=self.device), tok.pad_token_id
        rows = prompt_ids(tok, prompts)
        greedy = temperature <= 0
        was_training = self.model.training
        self.model.eval()
        out: list[Completion] = []
        devices = [self.device.index] if self.device.type == "cuda" and self.device.index is not None else []
        # Chunks of whole prompts; the loop prefills each prompt once and shares its KV cache with its samples.
        per_chunk = max(1, self.batch_size // n_samples)
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if self.device.type == "cuda":
                torch.cuda.manual_seed_all(seed)
            for start in range(0, len(rows), per_chunk):
                chunk = rows[start : start + per_chunk]
                if self.impl == "generate":
                    flat = [p for p in chunk for _ in range(n_samples)]  # prompt-major: sample j of i at i*n+j
                    ids, attn = (t.to(self.device) for t in left_pad(flat, pad))
                    seq, logp = self._generate(ids, attn, max_new_tokens, temperature, top_p, greedy, pad)
                else:
                    ids, attn = (t.to(self.device) for t in left_pad(chunk, pad))
                    seq, logp = self._decode(
                        ids, attn, n_samples, max_new_tokens, temperature, top_p, greedy, stops, pad
                    )
                for row_ids, row_lp in zip(seq.tolist(), logp.tolist()):
                    out.append(_completion(row_ids, row_lp, self.stop_ids, tok))
        if was_training:
            self.model.train()
        return [out[i * n_samples : (i + 1) * n_samples] for i in range(len(prompts))]

    def _generate(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool,
        pad: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.model.generate(
            input_ids=ids,  # (N, P)
            attention_mask=attn,  # (N, P)
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_p=top_p if not greedy else None,
            top_k=0 if not greedy else None,
            eos_token_id=self.stop_ids,
            pad_token_id=pad,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )
        seq = gen.sequences[:, ids.shape[1] :]  # (N, L)
        logits = torch.stack(gen.logits, dim=1).float()  # (N, L, V)
        scale = 1.0 if greedy else temperature
        return seq, torch.log_softmax(logits / scale, dim=-1).gather(-1, seq.unsqueeze(-1)).squeeze(-1)  # (N, L)

    def _decode(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        n_samples: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool,
        stops: torch.Tensor,
        pad: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill each prompt once, repeat its KV cache for its samples, then one cached forward per new token.
        ids, attn: (B, P) distinct prompts. Returns (N, L) tokens and log-probs, N = B * n_samples, prompt-major."""
        dev = ids.device
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, P) positions as in training
        cache_kw = cache_kwarg(self.model)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        past, logits, next_pos = cache_of(out), out.logits[:, -1], pos[:, -1] + 1  # (B, V), (B,)
        if n_samples > 1:
            rows = torch.arange(ids.shape[0], device=dev).repeat_interleave(n_samples)  # (N,)
            if select_cache_rows(past, rows):
                logits, attn, next_pos = logits[rows], attn[rows], next_pos[rows]
            else:  # unknown cache layout: prefill every sample
                ids, attn, pos = ids[rows], attn[rows], pos[rows]
                out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
                past, logits, next_pos = cache_of(out), out.logits[:, -1], pos[:, -1] + 1
        lean = lean_decoder(self.model, past, attn, max_new_tokens) if self.lean else None
        if lean is not None:  # the decoder holds its own copy of the keys and values: free the model's (and the
            past = out = None  # prefill logits `out` holds) rather than keep them for the whole rollout
        else:
            reserve_cache(past, max_new_tokens)  # each step writes its token in place instead of copying the cache
        N = logits.shape[0]
        tokens = torch.full((N, max_new_tokens), pad, dtype=torch.long, device=dev)  # (N, L)
        logps = torch.zeros((N, max_new_tokens), device=dev)  # (N, L)
        active = torch.arange(N, device=dev)  # (A,) rows still generating; finished rows leave the batch
        for t in range(max_new_tokens):
            logp_all = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)  # (A, V)
            if greedy:
                tok = logp_all.argmax(-1)  # (A,)
            else:
                tok = _sample(_top_p(logp_all, top_p))  # (A,)
            tokens[active, t] = tok
            logps[active, t] = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            running = ~torch.isin(tok, stops)  # (A,)
            if t + 1 == max_new_tokens or not bool(running.any()):
                break
            if not bool(running.all()):  # drop finished rows from the batch and the KV cache
                keep = torch.nonzero(running).squeeze(-1)  # (A',)
                if lean is not None:
                    lean.keep(keep)
                    active, tok, next_pos = active[keep], tok[keep], next_pos[keep]
                elif select_cache_rows(past, keep):  # an unknown cache layout keeps every row
                    active, tok, attn, next_pos = active[keep], tok[keep], attn[keep], next_pos[keep]
            if lean is not None:
                logits, next_pos = lean.step(tok, next_pos), next_pos + 1
                continue
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)  # (A, P+t+1)
            out = self.model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=attn,
                position_ids=next_pos.unsqueeze(-1),
                use_cache=True,
                **{cache_kw: past},
            )
            past, logits, next_pos = cache_of(out), out.logits[:, -1], next_pos + 1
        return tokens, logps  # (N, L), (N, L); _completion cuts each row after its stop id


def _sample(logp: torch.Tensor) -> torch.Tensor:
    """One token per row from log-probs (N, V) by inverse-CDF sampling: the first token whose cumulative
    probability exceeds a uniform draw. One uniform per row is much cheaper than torch.multinomial on CPU for a
    batch of rows (multinomial draws through a slower generator path). Float64 keeps the cumulative sum
    exact enough that no zero-probability token (top-p filtered) can be picked."""
    cum = logp.double().exp().cumsum(-1)  # (N, V)
    u = torch.rand(cum.shape[0], 1, dtype=torch.float64, device=cum.device) * cum[:, -1:]  # (N, 1) in [0, total)
    return torch.searchsorted(cum, u, right=True).squeeze(-1).clamp_(max=cum.shape[-1] - 1)  # (N,)


def _top_p(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of tokens with mass >= top_p. (N, V)."""
    if top_p >= 1.0:
        return logp
    sorted_lp, idx = logp.sort(dim=-1, descending=True)  # (N, V)
    cum = sorted_lp.exp().cumsum(-1)  # (N, V)
    drop = cum - sorted_lp.exp() >= top_p  # (N, V) tokens entirely beyond the nucleus
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.full_like(logp, float("-inf")).scatter(-1, idx, sorted_lp)  # (N, V)


def _completion(ids: list[int], logprobs: list[float], stop_ids: Sequence[int], tok: Any) -> Completion:
    end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
    if end is not None:
        ids, logprobs, reason = ids[:end], logprobs[:end], "stop"
    else:
        reason = "length"
    return Completion(
        token_ids=ids, text=tok.decode(ids, skip_special_tokens=True), logprobs=logprobs, finish_reason=reason
    )
