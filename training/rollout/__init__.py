"""Rollout engines: one `RolloutEngine` protocol, a transformers engine (CPU/GPU) and a vLLM engine (GPU).

    engine = make_engine("hf", model, tokenizer)
    groups = engine.generate(prompts, n_samples=8, max_new_tokens=32, temperature=1.0, top_p=1.0, seed=7)
    groups[i][j].text, groups[i][j].token_ids, groups[i][j].logprobs

To add an engine: implement `RolloutEngine` (base.py) in its own module, then name it in ENGINES and
`make_engine` below; stage configs validate their `rollout_engine` against ENGINES.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from training.rollout.base import Completion, RolloutEngine

if TYPE_CHECKING:  # the Airflow image imports ENGINES (the trigger form) and has no torch
    import torch

# name -> what it is; the one list of engine names (configs, the trigger form and tests read it).
ENGINES: dict[str, str] = {
    "hf": "transformers (CPU or GPU; shares the trainer's model object)",
    "vllm": "vLLM (GPU; the `gpu` extra)",
}


def make_engine(kind: str, model: Any, tokenizer: Any, **kwargs: Any) -> RolloutEngine:
    """'hf' (transformers generate, shares the trainer's model object) or 'vllm' (GPU; model is a folder)."""
    # Each engine is imported when asked for: hf needs torch, vllm needs vllm, and the Airflow image imports this
    # package (ENGINES, for the trigger form) with neither.
    if kind == "hf":
        from training.rollout.hf import HFRolloutEngine  # inside: torch

        return HFRolloutEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        from training.rollout.vllm import VLLMRolloutEngine  # inside: vllm, the optional `gpu` extra

        return VLLMRolloutEngine(model, tokenizer, **kwargs)
    raise ValueError(f"unknown rollout engine {kind!r}; use one of {', '.join(ENGINES)}")


def resolve_engine(name: str, device: torch.device) -> str:
    """ "auto" is vLLM on a CUDA device when vllm is installed, else transformers."""
    if name != "auto":
        return name
    from training.rollout.vllm import HAVE_VLLM  # inside: importing it imports vllm itself, where installed

    return "vllm" if device.type == "cuda" and HAVE_VLLM else "hf"


__all__ = ["ENGINES", "Completion", "RolloutEngine", "make_engine", "resolve_engine"]
