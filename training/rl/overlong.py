"""What a completion that reaches the length cap gets: DAPO's overlong reward shaping (Yu et al. 2025, "DAPO:
An Open-Source LLM Reinforcement Learning System at Scale", section 3.4).

At reasoning lengths many completions run into `max_new_tokens`; a cut chain of thought has no final answer, so
its verifier reward is 0, the same as a wrong answer, and the update cannot tell "too long" from "wrong". DAPO
offers two remedies, both here:

- soft overlong punishment (`overlong_buffer` > 0): in the last `buffer` tokens before the cap the reward
  falls linearly from 0 to -penalty, and a completion cut at the cap gets -penalty:

      R_len(|y|) = 0                                 if |y| <= L_max - buffer
                 = penalty * (L_max - buffer - |y|) / buffer   if L_max - buffer < |y| <= L_max

  (|y| never exceeds L_max here: the engine stops at the cap), added to the verifier's reward;
- overlong filtering (`truncated: mask`): a completion cut by the cap leaves the loss (its tokens are
  masked), but still counts in its group's advantages, so the reward noise of a cut answer teaches nothing.

The posttrain default is the soft punishment with masking off ("keep"): the penalty tells the policy to finish
inside the budget, which a reasoning preset needs, and masking alone would let lengths drift up unchecked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from training.rollout import Completion

TRUNCATED = ("keep", "mask")  # GRPOConfig.truncated


def effective_buffer(buffer: int, max_len: int) -> int:
    """The buffer a round uses: `buffer`, or DAPO's proportion (an eighth of the cap) where `buffer` does not fit
    under `max_len`, so a preset's buffer follows a shorter max_new_tokens a user sets instead of failing it."""
    return buffer if buffer < max_len else max_len // 8


def overlong_penalty(length: int, max_len: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment of a completion of `length` tokens under a cap of `max_len` (<= 0)."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return -penalty * min(1.0, (length - (max_len - buffer)) / buffer)


def shaped_rewards(
    rewards: Sequence[float], completions: Sequence[Completion], max_len: int, buffer: int, penalty: float
) -> tuple[list[float], list[float]]:
    """The rewards with each completion's overlong penalty added, and the penalties."""
    buffer = effective_buffer(buffer, max_len)
    pens = [overlong_penalty(len(c.token_ids), max_len, buffer, penalty) for c in completions]
    return [r + p for r, p in zip(rewards, pens)], pens


def masked_if_truncated(completion: Completion) -> Completion:
    """`completion` with every token out of the loss when the length cap cut it (overlong filtering)."""
    if completion.finish_reason != "length":
        return completion
    return dataclasses.replace(completion, model_mask=[0] * len(completion.token_ids))
