"""The `format` verifier: 1.0 when a completion has the shape its task's own verifier needs (an answer in the
required place for math, a program that parses for code, a JSON value for json_rules), right or wrong.

Meant as a small component of a weighted reward (`{"math": 0.9, "format": 0.1}`): it rewards following the
format early in RL, and evaluation reports accuracy next to it because format rising while accuracy falls is
the classic early failure. A task whose own verifier is `format` has nothing to delegate to: None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from training.rewards.base import REWARDS, Verifier, get_verifier, register_verifier


class FormatVerifier(Verifier):
    name = "format"
    any_task = True

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for task, completion in zip(tasks, completions):
            if task.verifier in (None, self.name):
                out.append(None)
                continue
            out.append(1.0 if get_verifier(task.verifier).format_ok(task, completion) else 0.0)
        return out

    def format_ok(self, task: Any, completion: str) -> bool:
        return bool(self.score([task], [completion])[0])


register_verifier(FormatVerifier())
format_reward = REWARDS["format"]
