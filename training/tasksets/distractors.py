"""Distractor text: other tasks as filler in front of a prompt, sized in tokens (the long-context examples of SFT
and the long-context sweep of evaluation)."""

from __future__ import annotations

import random
from typing import Any

from training.tasksets.schema import Task


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def distractor_text(tasks: list[Task], rng: random.Random, tokenizer: Any, budget: int) -> str:
    """Other tasks (prompt + reference) as filler, as many as fit in `budget` tokens (evaluation's long-context
    sweep, and SFT's long-context examples)."""
    parts, used = [], 0
    for _ in range(4 * max(budget, 1)):
        other = tasks[rng.randrange(len(tasks))]
        text = f"{other.prompt}{other.reference}\n"
        cost = _n_tokens(tokenizer, text)
        if used + cost > budget:
            if used:
                break
            continue
        parts.append(text)
        used += cost
    return "".join(parts)
