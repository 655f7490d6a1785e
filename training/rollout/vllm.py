"""Rollouts with vLLM (GPU). Importing this module never needs vllm; constructing the engine does.

    engine = VLLMRolloutEngine("/tmp/policy", tokenizer, gpu_memory_utilization=0.3)
    groups = engine.generate(prompts, n_samples=8, max_new_tokens=256, temperature=1.0, seed=step_seed)
    engine.update_weights(model.state_dict())      # after each optimizer step: in place, no reload
    engine.update_weights("/tmp/policy-round-2")   # or a saved folder: the engine is rebuilt from it

Weight sync: a state dict goes through the in-process model's `load_weights` (vLLM's own loader, which
handles fused/renamed parameters), reached with `LLM.apply_model`; the engine runs vLLM in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so no tensors cross a process boundary. When that path is unavailable
(older/newer vLLM), the state dict is saved to a temp folder and the engine is rebuilt from it: slower, always
correct. Log-probs are the sampled tokens' log-probs after temperature ("processed_logprobs" where vLLM
supports it), matching the transformers engine's convention.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from training.rollout.base import Completion

log = logging.getLogger(__name__)

try:  # vllm is the `gpu` extra; the CPU install and the tests run without it
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - ImportError, or a CUDA-less import failure inside vllm
    HAVE_VLLM = False


class VLLMRolloutEngine:
    def __init__(self, model: Any, tokenizer: Any = None, gpu_memory_utilization: float = 0.3,
                 dtype: str = "auto", max_model_len: int | None = None, enforce_eager: bool = True,
                 seed: int = 0) -> None:
        """`model`: a saved model folder (str/Path), or an HF model object (saved to a temp folder first)."""
        if not HAVE_VLLM:
            raise RuntimeError("the vllm rollout engine needs vllm: pip install 'posttrain[gpu]' on a CUDA machine")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.tokenizer = tokenizer
        self._tmp: tempfile.TemporaryDirectory | None = None
        if not isinstance(model, (str, Path)):
            self._tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
            model.save_pretrained(self._tmp.name)
            if tokenizer is not None:
                tokenizer.save_pretrained(self._tmp.name)
            model = self._tmp.name
        self.path = str(model)
        self.kwargs = {"gpu_memory_utilization": gpu_memory_utilization, "dtype": dtype,
                       "enforce_eager": enforce_eager, "seed": seed}
        if max_model_len:
            self.kwargs["max_model_len"] = max_model_len
        self.llm = self._build(self.path)

    def _build(self, path: str) -> Any:
        from vllm import LLM

        try:
            return LLM(model=path, logprobs_mode="processed_logprobs", **self.kwargs)
        except TypeError:  # a vLLM without logprobs_mode: raw log-probs (exact at temperature 1)
            return LLM(model=path, **self.kwargs)

    def generate(self, prompts: list[str], n_samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0) -> list[list[Completion]]:
        from vllm import SamplingParams

        greedy = temperature <= 0
        params = SamplingParams(n=n_samples, temperature=0.0 if greedy else temperature,
                                top_p=1.0 if greedy else top_p, max_tokens=max_new_tokens, seed=seed,
                                logprobs=0, skip_special_tokens=True)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for req in outputs:
            group = []
            for out in req.outputs:
                ids = list(out.token_ids)
                lps = [float(step[tid].logprob) if step and tid in step else 0.0
                       for tid, step in zip(ids, out.logprobs or [{}] * len(ids))]
                group.append(Completion(token_ids=ids, text=out.text, logprobs=lps,
                                        finish_reason="length" if out.finish_reason == "length" else "stop"))
            result.append(group)
        return result

    def update_weights(self, state_dict_or_path: Any) -> None:
        if isinstance(state_dict_or_path, (str, Path)):
            self._rebuild(str(state_dict_or_path))
            return
        items = [(k, v.detach()) for k, v in state_dict_or_path.items()]
        try:
            self.llm.apply_model(lambda m: m.load_weights(iter(items)))
            self.llm.reset_prefix_cache()
            return
        except (AttributeError, NotImplementedError, RuntimeError) as err:
            log.warning("vllm: in-place weight load unavailable (%s); rebuilding the engine from a saved copy", err)
        from transformers import AutoModelForCausalLM

        tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-sync-")
        model = AutoModelForCausalLM.from_pretrained(self.path)
        model.load_state_dict({k: v.cpu() for k, v in items}, strict=False)
        model.save_pretrained(tmp.name)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp.name)
        self._rebuild(tmp.name)
        self._tmp = tmp

    def _rebuild(self, path: str) -> None:
        import gc

        del self.llm
        gc.collect()
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
        self.path = path
        self.llm = self._build(path)
