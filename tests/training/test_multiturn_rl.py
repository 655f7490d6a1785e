"""Multi-turn RL teaches repair (issue 15's demonstration, one fixed seed): from the same SFT model on the tiny
profile's code tasks, a multi-turn GRPO round (episodes of up to 2 answers, the code-repair environment
showing the visible tests' failure) against a single-turn round. On the code holdout, measured as evaluation
measures it (greedy, hidden tests): self-repair within 2 turns at least 10 points higher after the multi-turn
round, first-attempt pass@1 not lower. `python benchmarks/multiturn.py` runs the same for seeds 0-2."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

SEED = 0


def test_multi_turn_round_beats_single_turn_on_self_repair(tmp_path, local_mlflow) -> None:
    from benchmarks.multiturn import run_seed

    r = run_seed(SEED, {}, tmp_path, own_tracking=False)
    single, multi = r["single"], r["multi"]
    assert multi["within2"] - single["within2"] >= 0.10, r
    assert multi["first"] >= single["first"], r
