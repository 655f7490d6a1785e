"""Multi-turn RL teaches repair (issue 15's demonstration, one fixed seed): from the same SFT model on the tiny
profile's code tasks, a multi-turn GRPO round (episodes of up to 2 answers, the code-repair environment
showing the visible tests' failure) against a single-turn round, measured on the code holdout as evaluation
measures it (greedy, hidden tests).

What one seed can show, and what it is asked: after a failed first attempt the multi-turn model repairs
credibly more often than the single-turn one (one-sided p < 0.05, the gate's test), so it passes more tasks
within 2 turns; its first attempts are not credibly worse (paired, p >= 0.05) and it loses none on code level 4,
the learnable level (level 5's reading is a coin flip per task). The issue's goal in points (+10 points of
self-repair@2, first attempts not lower) is a mean over seeds: `python benchmarks/multiturn.py` measures it
(docs/results.md, "Multi-turn RL").

Why not the points on one seed: the tiny run hangs on float rounding. On two CPUs the same code and seed gave
repair@2 gains above and below the +10 points and first attempts up and down by level-5 coin flips, while the
repairs after a failed first attempt told the same story on both (docs/results.md, "The seed-fixed quality
tests on two CPUs").
"""

from __future__ import annotations

import pytest

# The benchmark's recipe at the suite's 2 threads on the pinned AVX2 float path (benchmarks/numerics.py).
# About 6 to 11 minutes alone, by machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SEED = 2


def test_multi_turn_round_beats_single_turn_on_self_repair(tmp_path, local_mlflow) -> None:
    from benchmarks.multiturn import repair_evidence, run_seed

    r = run_seed(SEED, {}, tmp_path, own_tracking=False)
    ev = repair_evidence(r["single"], r["multi"])
    shown = {
        name: {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items() if k != "outcomes"}
        for name, figures in r.items()
    }
    print(shown, ev)
    single, multi = r["single"], r["multi"]
    assert ev["repaired"]["multi"][1] > 0, (shown, ev)  # there were failed first attempts to repair
    assert ev["repair_p"] < 0.05, (shown, ev)
    assert multi["within2"] > single["within2"], (shown, ev)
    assert ev["first_p"] >= 0.05, (shown, ev)
    # level 4 is the learnable one (level 5's reading is a coin flip per task): no first attempt lost there
    assert multi["first_by_level"][4][0] >= single["first_by_level"][4][0], (shown, ev)
