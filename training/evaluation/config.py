"""`EvalConfig`: the `evaluate` stage's config, beside the measurements that read it (measure.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.config import ConfigBase
from training.registry import DEFAULT_MODEL_NAME


@dataclass(frozen=True)
class EvalConfig(ConfigBase):
    """Holdout evaluation.

    candidate:          "latest" (the highest complete rl_round_N of this run, else sft), a stage name of this
                        run, or a model folder URI.
    baseline_stage:     the SFT stage of this run, the reference every RL round must beat.
    compare_champion:   also evaluate the MLflow registry's `champion` of `model_name` (skipped if none yet).
    max_tasks_per_domain: cap on holdout tasks per domain (keeps evaluation cheap on CPU).
    n_samples / ks:     samples per task at `temperature` for unbiased pass@k (Chen et al. 2021), k <= n.
    repair_turns:       self-repair: answers after the first in a greedy episode (R; training/environments), so
                        the report has pass within 1..R+1 turns per domain with an environment.
    environments:       domain -> environment for self-repair, overriding the one its tasks' verifier names
                        (`Verifier.environment`; code: "code_repair"); "" = none (as rl_round's `environments`).
    long_context_tasks: tasks per domain re-asked behind distractor text (other tasks), once per point of the
                        sweep: long_context_fractions of the model's context window (cut to what fits with the
                        prompt and max_new_tokens). distractor_tokens: the one length used when the model names
                        no context window.
    device:             "auto" (CUDA when visible), "cpu" or "cuda"; bf16 weights on CUDA.
    rollout_engine:     "auto" (vLLM on CUDA when installed, else transformers), "hf" or "vllm".
    vllm_gpu_memory_utilization, vllm_max_model_len: the vLLM engine's settings (0 = the model's context).
    sandbox_url:        the sandbox HTTP service code tasks run on (token from POSTTRAIN_SANDBOX_TOKEN); "" =
                        POSTTRAIN_SANDBOX_URL, else the local sandbox pool.

    Prompts are rendered with each model's chat template and saved chat settings, as in training; a task whose
    prompt does not fit the model's context with max_new_tokens is dropped and counted, never cut.
    """

    candidate: str = "latest"
    baseline_stage: str = "sft"
    compare_champion: bool = True
    model_name: str = DEFAULT_MODEL_NAME
    max_tasks_per_domain: int = 200
    max_new_tokens: int = 48
    n_samples: int = 8
    ks: list[int] = field(default_factory=lambda: [1, 4, 8])
    temperature: float = 0.8
    repair_turns: int = 1
    environments: dict[str, str] = field(default_factory=dict)
    long_context_tasks: int = 40
    distractor_tokens: int = 48
    long_context_fractions: list[float] = field(default_factory=lambda: [0.1, 0.25, 0.5])
    seed: int = 0
    batch_size: int = 256
    device: str = "auto"
    rollout_engine: str = "auto"
    vllm_gpu_memory_utilization: float = 0.6
    vllm_max_model_len: int = 0
    sandbox_url: str = ""

    def __post_init__(self) -> None:
        if any(not 0 < f < 1 for f in self.long_context_fractions):
            raise ValueError(f"long_context_fractions must lie strictly between 0 and 1: {self.long_context_fractions}")
