"""Rollouts with vLLM (GPU). Importing this module never needs vllm; constructing the engine does.

    engine = VLLMRolloutEngine("/tmp/policy", tokenizer, stop_ids=fmt.stop_ids, gpu_memory_utilization=0.4)
    groups = engine.generate(prompt_ids, n_samples=8, max_new_tokens=512, temperature=1.0, seed=step_seed)
    engine.sleep(); ...policy update...; engine.wake_up()
    engine.update_weights(merged_state_dict(model))   # after each optimizer step: in place, no reload

Prompts go in as token ids (`TokensPrompt`), so vLLM sees exactly the ids the trainer sees, and completions stop
at any of `stop_ids` (every EOS of the generation config and the chat template's end-of-turn token).

Sharing one GPU with the trainer: with `enable_sleep_mode` the engine is put to sleep around the policy update
(`LLM.sleep(level=1)` offloads its weights to CPU memory and drops its KV cache, `wake_up` brings them back), so
the trainer's activations and optimizer state get the memory back. Prefix caching (on by default) reuses the
KV cache of a prompt across its G samples and across the turns of a conversation.

Weight sync: a state dict goes through the in-process model's `load_weights` (vLLM's own loader, which handles
fused and renamed parameters), reached with `LLM.apply_model`; the engine runs vLLM in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so no tensors cross a process boundary, and the prefix cache is reset after.
A LoRA policy is synced as merged weights (training.modeling.lora.merged_state_dict). When the in-place path is
unavailable, the state dict is saved to a temp folder and the engine is rebuilt from it: slower, always
correct. `last_sync_s` is the wall time of the last sync (logged every step). Log-probs are the sampled tokens'
log-probs after temperature ("processed_logprobs" where vLLM supports it), the transformers engine's convention,
so the trainer can correct for the engine/trainer mismatch (truncated importance sampling).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.modeling.models import save_pretrained
from training.rollout.base import Completion, Prompt, prompt_ids

log = logging.getLogger(__name__)

try:  # vllm is the `gpu` extra; the CPU install and the tests run without it
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - ImportError, or a CUDA-less import failure inside vllm
    HAVE_VLLM = False


class VLLMRolloutEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        stop_ids: Sequence[int] | None = None,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        tensor_parallel_size: int = 1,
    ) -> None:
        """`model`: a saved model folder (str/Path), or an HF model object (saved to a temp folder first)."""
        if not HAVE_VLLM:
            raise RuntimeError("the vllm rollout engine needs vllm: pip install 'posttrain[gpu]' on a CUDA machine")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids) if stop_ids else ([tokenizer.eos_token_id] if tokenizer is not None else [])
        self.last_sync_s = 0.0
        self.sleeping = False
        self._tmp: tempfile.TemporaryDirectory | None = None
        if not isinstance(model, (str, Path)):
            # Plain weights, a LoRA policy merged: vLLM serves what the trainer's policy computes.
            self._tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
            save_pretrained(model, tokenizer, self._tmp.name)
            model = self._tmp.name
        self.path = str(model)
        self.kwargs: dict[str, Any] = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            "enable_sleep_mode": enable_sleep_mode,
            "tensor_parallel_size": tensor_parallel_size,
        }
        if max_model_len:
            self.kwargs["max_model_len"] = max_model_len
        self.llm = self._build(self.path)

    def _build(self, path: str) -> Any:
        from vllm import LLM

        try:
            return LLM(model=path, logprobs_mode="processed_logprobs", **self.kwargs)
        except TypeError:  # a vLLM without logprobs_mode: raw log-probs (exact at temperature 1)
            return LLM(model=path, **self.kwargs)

    def generate(
        self,
        prompts: Sequence[Prompt],
        n_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[list[Completion]]:
        from vllm import SamplingParams, TokensPrompt

        if self.sleeping:
            self.wake_up()
        greedy = temperature <= 0
        params = SamplingParams(
            n=n_samples,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            max_tokens=max_new_tokens,
            seed=seed,
            logprobs=0,
            skip_special_tokens=True,
            stop_token_ids=self.stop_ids,
        )
        ids = prompt_ids(self.tokenizer, prompts)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
        result = []
        for req in outputs:
            group = []
            for out in req.outputs:
                token_ids = list(out.token_ids)
                lps = [
                    float(step[tid].logprob) if step and tid in step else 0.0
                    for tid, step in zip(token_ids, out.logprobs or [{}] * len(token_ids))
                ]
                group.append(
                    Completion(
                        token_ids=token_ids,
                        text=out.text,
                        logprobs=lps,
                        finish_reason="length" if out.finish_reason == "length" else "stop",
                    )
                )
            result.append(group)
        return result

    def sleep(self) -> None:
        """Free the GPU for the policy update (weights offloaded, KV cache dropped); needs enable_sleep_mode."""
        if self.kwargs["enable_sleep_mode"] and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def update_weights(self, state_dict_or_path: Any) -> None:
        started = time.perf_counter()
        try:
            self._update_weights(state_dict_or_path)
        finally:
            self.last_sync_s = time.perf_counter() - started

    def _update_weights(self, state_dict_or_path: Any) -> None:
        if isinstance(state_dict_or_path, (str, Path)):
            self._rebuild(str(state_dict_or_path))
            return
        if self.sleeping:
            self.wake_up()
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
        self.sleeping = False
