"""How big a model is, from its config.json alone: no weights loaded, no torch, so the scheduler can pick a
preset (training/profiles.py) for a folder whose name says nothing about its size.

`parameter_count(config)` counts the weight matrices of a decoder-only transformer from the fields the
transformers configs use (Llama, Qwen2/Qwen3, Mistral, Gemma, Phi-3, GPT-2 and their MoE variants): the
embedding (and learned positions, GPT-2), the untied output head, and per layer the attention projections
(grouped-query heads counted as such), the MLP (gated or not, per expert for MoE) and the router. Norms and
biases are left out (well under 1% of any real model). `read_model_config(base_model)` finds the config.json of
a local folder, an s3:// or file:// model folder in posttrain storage, or a hub id already in the local Hugging
Face cache; None when there is none to read (the name is then the fallback).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from training import storage

log = logging.getLogger("posttrain")

# The first field present wins, as transformers' own attribute_map does for GPT-2-style names.
_FIELDS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "multi_query_group_num"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "expert_intermediate": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts", "num_shared_experts"),
}
# Gated MLPs (SwiGLU/GeGLU) have three matrices: gate, up and down; GPT-2-style have two.
_UNGATED = ("gpt2", "gpt_neo", "gptj", "opt", "bloom", "falcon", "gpt_bigcode")
# Learned absolute position embeddings (the rest use rotary or ALiBi: no weights).
_LEARNED_POSITIONS = ("gpt2", "gpt_neo", "gpt_bigcode", "opt")


def _get(config: dict[str, Any], key: str) -> Any:
    for name in _FIELDS[key]:
        if config.get(name) is not None:
            return config[name]
    return None


def parameter_count(config: dict[str, Any]) -> int:
    """Weights of the model a config.json describes (multimodal configs: their `text_config`)."""
    if isinstance(config.get("text_config"), dict) and _get(config, "hidden") is None:
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    hidden, layers, heads = _get(config, "hidden"), _get(config, "layers"), _get(config, "heads")
    vocab = config.get("vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, heads, vocab)):
        raise ValueError(
            "config.json lacks the sizes to count parameters (hidden_size, num_hidden_layers, "
            f"num_attention_heads, vocab_size); model_type {config.get('model_type')!r}"
        )
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(_get(config, "kv_heads") or heads)
    gated = not str(config.get("model_type", "")).startswith(_UNGATED)
    intermediate = int(_get(config, "intermediate") or 4 * hidden)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o and k, v
    mlp_matrices = 3 if gated else 2
    experts = int(_get(config, "experts") or 0)
    if experts:
        per_expert = mlp_matrices * hidden * int(_get(config, "expert_intermediate") or intermediate)
        shared = int(_get(config, "shared_experts") or 0) * per_expert
        mlp = experts * per_expert + shared + hidden * experts  # + the router
    else:
        mlp = mlp_matrices * hidden * intermediate
    embeddings = vocab * hidden
    if str(config.get("model_type", "")) in _LEARNED_POSITIONS:
        positions = int(config.get("n_positions") or config.get("max_position_embeddings") or 0)
    else:
        positions = 0
    tied = bool(config.get("tie_word_embeddings", True))
    return embeddings * (1 if tied else 2) + positions * hidden + layers * (attention + mlp)


def _local_config(folder: Path) -> dict[str, Any] | None:
    for candidate in (folder / "config.json", folder / "model" / "config.json"):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return None


def _hub_cache_config(model_id: str) -> dict[str, Any] | None:
    """The config.json of a hub id already downloaded to the Hugging Face cache (never downloads)."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = home.expanduser() / f"models--{model_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return json.loads(found[-1].read_text()) if found else None


def read_model_config(base_model: str) -> dict[str, Any] | None:
    """config.json of `base_model`: a local folder, a storage URI (s3://, file://) or a cached hub id."""
    if not base_model:
        return None
    if "://" in base_model:
        loc = storage.locate(base_model)
        for rel in ("config.json", "model/config.json"):
            if loc.backend.exists(loc.key(rel)):
                return json.loads(loc.backend.get_bytes(loc.key(rel)))
        return None
    path = Path(base_model).expanduser()
    if path.is_dir():
        return _local_config(path)
    return _hub_cache_config(base_model)


def model_size_b(base_model: str) -> tuple[float | None, str]:
    """(billions of parameters, how it was found: "config.json" or "name"), or (None, "unknown")."""
    try:
        config = read_model_config(base_model)
    except Exception as err:  # storage unreachable, no credentials, a broken file: the name still says something
        log.warning(
            "sizing %s by its name: its config.json could not be read (%s: %s)", base_model, type(err).__name__, err
        )
        config = None
    if config is not None:
        return parameter_count(config) / 1e9, "config.json"
    found = re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", base_model.rstrip("/").rsplit("/", 1)[-1])
    return (float(found[-1]), "name") if found else (None, "unknown")
