"""Rollout engines: one `RolloutEngine` protocol, a transformers engine (CPU/GPU) and a vLLM engine (GPU).

    engine = make_engine("hf", model, tokenizer)
    groups = engine.generate(prompts, n_samples=8, max_new_tokens=32, temperature=1.0, top_p=1.0, seed=7)
    groups[i][j].text, groups[i][j].token_ids, groups[i][j].logprobs
"""

from training.rollout.base import Completion, RolloutEngine, make_engine

__all__ = ["Completion", "RolloutEngine", "make_engine"]
