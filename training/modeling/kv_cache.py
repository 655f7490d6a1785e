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
            if type(layer) in _RESERVED.values():
                layer.select_rows(rows)
                continue
            layer.keys = layer.keys.index_select(0, rows)  # (A', H, T, d)
            layer.values = layer.values.index_select(0, rows)  # (A', H, T, d)
        return True
    if hasattr(cache, "key_cache"):
        cache.key_cache = [k.index_select(0, rows) for k in cache.key_cache]
        cache.value_cache = [v.index_select(0, rows) for v in cache.value_cache]
        return True
    return False


class _ReservedLayer:
    """The methods `reserve_cache` gives a transformers DynamicLayer (a subclass made from them, swapped in as
    the layer's class; it adds no instance layout, so the swap is allowed): its keys/values are views of buffers with
    room for `extra` more tokens, so that each decode step writes one token in place. DynamicLayer's update
    concatenates, copying the whole cache every step: O(L^2) copying over a length-L rollout, ~10-25% of a
    5M-parameter model's rollout at L = 128-512 on a CPU. The views hold exactly the values the concatenation
    would, so attention sees the same keys and values."""

    keys: torch.Tensor
    values: torch.Tensor
    _kbuf: torch.Tensor
    _vbuf: torch.Tensor
    _len: int

    def _reserve(self, extra: int) -> None:
        n = self.keys.shape[-2]
        shape = (*self.keys.shape[:-2], n + extra, self.keys.shape[-1])  # (B, H, T + extra, d)
        self._kbuf = self.keys.new_empty(shape)
        self._vbuf = self.values.new_empty(shape)
        self._kbuf[..., :n, :] = self.keys
        self._vbuf[..., :n, :] = self.values
        self._len = n
        self._views()

    def _views(self) -> None:
        self.keys = self._kbuf[..., : self._len, :]  # (B, H, T, d)
        self.values = self._vbuf[..., : self._len, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self._len + n > self._kbuf.shape[-2]:  # past the reservation: grow as DynamicLayer would
            self.__class__ = self.__class__.__bases__[0]  # the plain layer class, contiguous tensors
            self.keys, self.values = self.keys.contiguous(), self.values.contiguous()
            return self.update(key_states, value_states, *args, **kwargs)
        self._kbuf[..., self._len : self._len + n, :] = key_states
        self._vbuf[..., self._len : self._len + n, :] = value_states
        self._len += n
        self._views()
        return self.keys, self.values

    def select_rows(self, rows: torch.Tensor) -> None:
        self._kbuf = self._kbuf.index_select(0, rows)
        self._vbuf = self._vbuf.index_select(0, rows)
        self._views()


_RESERVED: dict[type, type] = {}


def reserve_cache(cache: Any, extra: int) -> bool:
    """Give every layer of a transformers DynamicCache room for `extra` more tokens, in place (see
    _ReservedLayer). False (cache untouched) for a layout we do not know."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(
        type(layer).__name__ == "DynamicLayer"
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
        and layer.keys.dim() == 4
        for layer in layers
    ):
        return False
    for layer in layers:
        base = type(layer)
        if base not in _RESERVED:
            methods = {k: v for k, v in vars(_ReservedLayer).items() if callable(v)}
            _RESERVED[base] = type(f"Reserved{base.__name__}", (base,), {"__slots__": (), **methods})
        layer.__class__ = _RESERVED[base]
        layer._reserve(extra)
    return True
