"""The tiny profile end to end: task set -> SFT -> 2 GRPO rounds, fixed seeds, real stages and verifiers.

Asserts the issue's bar: arithmetic holdout pass@1 (greedy) after round 2 is at least 10 points above the SFT
checkpoint's, and no domain's holdout pass@1 drops by more than 1 point.

How the settings were chosen (measured on 2 shared CPU cores, see the PR report):
- math difficulties 1-2 (one-digit sums; two-digit +/- one-digit): learnable by a 0.47M-parameter GPT-2 in a
  few hundred steps; code/extraction at the same levels are near-saturated by SFT and must not regress.
- SFT is stopped at 300 steps at a constant LR (min_lr_ratio=1): short of converged, so RL has headroom; its
  greedy arithmetic pass@1 is 18-70% depending on the seed (65.6% for seed 0). At 200 steps it was 7-40%,
  too weak for RL to find correct samples on some seeds.
- RL: 32 prompts x 8 samples, lr 2e-4 (15x below SFT's), beta 0.01 (k3 KL to SFT), math-heavy
  domain mix 0.8/0.1/0.1 with the other domains kept in the mix so they do not drift, 150 steps per round.
- `python benchmarks/lift_seeds.py` runs this for seeds 0-4 (see training/profiles.py for the figures).
"""

from __future__ import annotations

import pytest

from training import stage
from training.config import from_dict
from training.profiles import TINY

pytestmark = pytest.mark.slow

SEED = 0
# The tiny profile exactly as the DAG runs it (training/profiles.py).
TASKSET = {"seed": SEED, **TINY["taskset"]}
SFT = {"seed": SEED, **TINY["sft"]}
GRPO = {"seed": SEED, **TINY["rl_round"]}


def test_sft_then_two_rounds_lift_arithmetic(file_run_uri, local_mlflow) -> None:
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.rl_round import GRPOConfig, run_round
    from training.stages.sft import SFTConfig, train

    stage.run_stage("taskset", from_dict(TasksetConfig, TASKSET), file_run_uri, taskset_body)
    stage.run_stage("sft", from_dict(SFTConfig, SFT), file_run_uri, train)
    r1 = stage.run_stage("rl_round_1", from_dict(GRPOConfig, GRPO), file_run_uri, lambda ctx: run_round(ctx, 1))
    r2 = stage.run_stage("rl_round_2", from_dict(GRPOConfig, GRPO), file_run_uri, lambda ctx: run_round(ctx, 2))

    sft = r1.summary["holdout_before"]  # the SFT checkpoint, measured by round 1 before its first update
    final = r2.summary["holdout_after"]
    table = "\n".join(f"  {d:10s} sft {sft[d]:.3f}  round1 {r1.summary['holdout_after'][d]:.3f}  round2 {final[d]:.3f}"
                      for d in sorted(sft))
    print("holdout pass@1 (greedy):\n" + table)
    lifted = [d for d in sft if d != "all" and final[d] - sft[d] >= 0.10]
    assert len(lifted) >= 2, f"RL lifted {lifted} by 10 points or more; the profile promises 2 domains\n{table}"
    for domain in sft:
        assert final[domain] >= sft[domain] - 0.01, f"{domain} dropped\n{table}"
