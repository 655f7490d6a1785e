"""Which models an evaluation compares: the candidate (the newest complete RL round, or one named), the run's
SFT baseline, and the registry's champion."""

from __future__ import annotations

from typing import Any

from training import storage
from training.stage import rl_round_stage


def latest_policy_stage(rounds: list[dict[str, Any]], baseline: str = "sft") -> str:
    """The newest complete RL round (from `rounds_history`), else the baseline stage."""
    return rounds[-1]["stage"] if rounds else baseline


def rounds_history(run_uri: str) -> list[dict[str, Any]]:
    """Per complete RL round: its stage name and summary (train reward, holdout check) for plots and gate."""
    out, n = [], 1
    while (m := storage.read_manifest(storage.join(run_uri, rl_round_stage(n)))) is not None:
        out.append({"stage": rl_round_stage(n), **m.extra.get("summary", {})})
        n += 1
    return out
