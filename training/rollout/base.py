"""The one interface every rollout engine implements, the record it returns, and prompt padding.

Engines take prompts as token ids (a stage renders them with training.modeling.chat.PromptFormat), so special tokens
and BOS are exactly what the trainer sees; a plain string is tokenised without special tokens (tests, tools).
Every engine stops a completion at any of its `stop_ids` (every EOS of the generation config and the chat
template's end-of-turn token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

# torch is imported where it is used: the Airflow image imports ENGINES (the trigger form) and has no torch.
if TYPE_CHECKING:
    import torch

Prompt = Sequence[int] | str


@dataclass
class Completion:
    """One sampled completion of one prompt.

    token_ids:     completion tokens only (no prompt, no padding); ends with the stop id when the model stopped.
    text:          decoded completion, special tokens removed.
    logprobs:      sampling-time log-probabilities of each token in token_ids under the engine's policy
                   at `temperature` (before top-p truncation), len == len(token_ids).
    finish_reason: "stop" (a stop id was sampled) or "length" (max_new_tokens reached).
    model_mask:    for a multi-turn episode laid out as one completion (training/environments): 1 on the tokens
                   the model generated, 0 on the environment's (its replies between turns), which the loss
                   leaves out; empty = every token is the model's.
    answer_starts: for an episode: where each answer (the model's, or a planted first one) begins in token_ids;
                   empty for a single-turn completion.
    """

    token_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    model_mask: list[int] = field(default_factory=list)
    answer_starts: list[int] = field(default_factory=list)


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions; `update_weights` makes the engine sample from the trainer's latest policy."""

    stop_ids: list[int]

    def generate(
        self,
        prompts: Sequence[Prompt],
        n_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[list[Completion]]:
        """len(result) == len(prompts); len(result[i]) == n_samples. temperature 0 means greedy."""
        ...

    def update_weights(self, state_dict_or_path: Any) -> None:
        """Load new policy weights: a state dict (name -> tensor) or a saved model folder."""
        ...

    def sleep(self) -> None:
        """Give accelerator memory back to the trainer until the next `generate` or `wake_up` (may be a no-op)."""
        ...

    def wake_up(self) -> None: ...


def prompt_ids(tokenizer: Any, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt: ids pass through; a string is tokenised without special tokens."""
    return [
        list(tokenizer(p, add_special_tokens=False)["input_ids"]) if isinstance(p, str) else list(p) for p in prompts
    ]


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask), each (N, P): rows right-aligned, padding on the left, as batched decoding needs."""
    width = max((len(r) for r in rows), default=0)
    import torch

    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (N, P)
    attn = torch.zeros((len(rows), width), dtype=torch.long)  # (N, P)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            attn[i, width - len(row) :] = 1
    return ids, attn


def length_cut_share(groups: Sequence[Sequence[Completion]]) -> float:
    """The share of completions that hit max_new_tokens instead of stopping (logged every step)."""
    flat = [c for g in groups for c in g]
    return sum(c.finish_reason == "length" for c in flat) / max(1, len(flat))
