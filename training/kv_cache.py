"""Transformers KV caches, handled the same way by the rollout loop and the GRPO update.

Both prefill a prompt once and reuse its keys/values for the prompt's G samples (rows repeated), and the
rollout loop drops finished rows. These helpers hide the cache layouts and keyword names that differ across
transformers versions.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def cache_kwarg(model: Any) -> str:
    """The forward keyword that takes a KV cache: transformers 5.x renamed `past_key_values` to `cache` (the old
    name warns until 5.40)."""
    # A peft wrapper's forward takes **kwargs and passes them on: ask the model underneath.
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache of a forward output (`cache` in transformers 5.x, `past_key_values` before)."""
    # not out.get("cache", out.past_key_values): that reads the old attribute even when it is gone
    return out["cache"] if "cache" in out else out.past_key_values  # noqa: SIM401


def select_cache_rows(cache: Any, rows: torch.Tensor) -> bool:
    """Keep (or repeat) `rows` of a KV cache, in place. False (cache untouched) for a layout we do not know."""
    if hasattr(cache, "layers") and all(hasattr(layer, "keys") for layer in cache.layers):
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, rows)  # (A', H, T, d)
            layer.values = layer.values.index_select(0, rows)  # (A', H, T, d)
        return True
    if hasattr(cache, "key_cache"):
        cache.key_cache = [k.index_select(0, rows) for k in cache.key_cache]
        cache.value_cache = [v.index_select(0, rows) for v in cache.value_cache]
        return True
    return False
