"""The tiny profile end to end: task set -> SFT -> 2 GRPO rounds, fixed seeds, real stages and verifiers.

Asserts the profile's bar (training/profiles.py says how its settings were chosen): greedy holdout pass@1 after
round 2 is at least 10 points above the SFT checkpoint's in at least 2 domains, and the promotion gate's
regression rule, at its defaults, finds no domain credibly worse than the SFT checkpoint (paired on the holdout
tasks, Holm across the domains). `python benchmarks/lift_seeds.py` runs this for several seeds;
`python benchmarks/tiny_dimensions.py` adds the evaluation's other dimensions.

Why the gate's rule and not a fixed 1-point bound: the tiny run hangs on float rounding, and on another CPU the
same seed and code lost code holdout tasks within a 56-task domain's spread while the other domains rose
(docs/results.md, "The seed-fixed quality tests on two CPUs"). A bound below one task's worth of a domain is a
property of one float path; the gate's test is what decides whether the pipeline promotes.
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


# The whole tiny profile trained for real: 263-316 s in earlier CI runs, 546-561 s on slower machines (alone on an
# idle one, and in CI), past pytest's 600 s default with any load beside it. The limit guards against a hang, not
# the speed.
@pytest.mark.timeout(1500)
def test_sft_then_two_rounds_lift_two_domains(file_run_uri, local_mlflow) -> None:
    from training.rl.config import GRPOConfig
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.rl_round import run_round
    from training.stages.sft import SFTConfig, train

    stage.run_stage("taskset", from_dict(TasksetConfig, TASKSET), file_run_uri, taskset_body)
    stage.run_stage("sft", from_dict(SFTConfig, SFT), file_run_uri, train)
    r1 = stage.run_stage("rl_round_1", from_dict(GRPOConfig, GRPO), file_run_uri, lambda ctx: run_round(ctx, 1))
    r2 = stage.run_stage("rl_round_2", from_dict(GRPOConfig, GRPO), file_run_uri, lambda ctx: run_round(ctx, 2))

    sft = r1.summary["holdout_before"]  # the SFT checkpoint, measured by round 1 before its first update
    final = r2.summary["holdout_after"]
    table = "\n".join(
        f"  {d:10s} sft {sft[d]:.3f}  round1 {r1.summary['holdout_after'][d]:.3f}  round2 {final[d]:.3f}"
        for d in sorted(sft)
    )
    print("holdout pass@1 (greedy):\n" + table)
    # 1e-9: 4 more of 40 tasks is 10 points, though 0.725 - 0.625 is 0.0999... in floats
    lifted = [d for d in sft if d != "all" and final[d] - sft[d] >= 0.10 - 1e-9]
    assert len(lifted) >= 2, f"RL lifted {lifted} by 10 points or more; the profile promises 2 domains\n{table}"
    assert final["all"] > sft["all"], table

    checks = gate_regression_vs_sft(file_run_uri)
    assert {c.domain for c in checks} == set(sft), checks  # every domain was tested, and all of them pooled
    print("\n".join(c.message for c in checks))
    blocked = [c.message for c in checks if c.decision == "block"]
    assert not blocked, "\n".join(blocked) + f"\n{table}"


def gate_regression_vs_sft(run: str) -> list:
    """The gate's rule 1 (pass@1 regression) for round 2's model against the SFT checkpoint, on the holdout
    outcomes the rounds recorded (round 1's before its first update is the SFT model's), adjusted as one family."""
    from training import storage
    from training.evaluation.gate_config import Counts, GateConfig
    from training.evaluation.gate_regression import adjust_family, regression_checks

    def counts(stage_name: str, when: str) -> dict[str, Counts]:
        report = storage.read_json(storage.require_manifest(storage.join(run, stage_name)), "round_report.json")
        return {d: Counts(sum(o.values()), len(o), o) for d, o in report["holdout_outcomes"][when].items()}

    cfg = GateConfig()
    checks = regression_checks(counts("rl_round_2", "after"), counts("rl_round_1", "before"), "sft", cfg)
    return adjust_family(checks, cfg)
