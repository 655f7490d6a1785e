"""The one interface every rollout engine implements, and the record it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Completion:
    """One sampled completion of one prompt.

    token_ids:     completion tokens only (no prompt, no padding); ends with EOS when the model stopped.
    text:          decoded completion, special tokens removed.
    logprobs:      sampling-time log-probabilities of each token in token_ids under the engine's policy
                   at `temperature` (before top-p truncation), len == len(token_ids).
    finish_reason: "stop" (EOS) or "length" (max_new_tokens reached).
    """

    token_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions; `update_weights` makes the engine sample from the trainer's latest policy."""

    def generate(self, prompts: list[str], n_samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0) -> list[list[Completion]]:
        """len(result) == len(prompts); len(result[i]) == n_samples. temperature 0 means greedy."""
        ...

    def update_weights(self, state_dict_or_path: Any) -> None:
        """Load new policy weights: a state dict (name -> tensor) or a saved model folder."""
        ...
