"""Gate maths against hand-computed and published values; verdicts on planted scenarios."""

from __future__ import annotations

import pytest

from training.evaluation.gate_rules import Counts, decide, diff_interval, wilson_interval
from training.stages.gate import GateConfig


def test_wilson_hand_computed() -> None:
    # 8/10, z=1.96: denom = 1 + 3.8416/10 = 1.38416; centre = (0.8 + 3.8416/20)/1.38416 = 0.716738
    # half = 1.96*sqrt(0.8*0.2/10 + 3.8416/400)/1.38416 = 1.96*0.160012/1.38416 = 0.226580
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.490158, abs=1e-5) and hi == pytest.approx(0.943318, abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(0, 10)  # centre = 0.19208/1.38416 = 0.13877 = half: lower bound exactly 0
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.27754, abs=1e-4)


def test_newcombe_published_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, Table II example (a): 56/70 - 48/80 = 0.175,
    # method 10 (score, no continuity correction): 0.0524 to 0.3339.
    lo, hi = diff_interval(56, 70, 48, 80)
    assert lo == pytest.approx(0.0524, abs=5e-4) and hi == pytest.approx(0.3339, abs=5e-4)
    # Example (e): 9/10 - 3/10 = 0.6, method 10: 0.1705 to 0.8090.
    lo, hi = diff_interval(9, 10, 3, 10)
    assert lo == pytest.approx(0.1705, abs=5e-4) and hi == pytest.approx(0.8090, abs=5e-4)


def test_unsupported_confidence() -> None:
    with pytest.raises(ValueError, match="confidence 0.5 not supported"):
        wilson_interval(1, 2, 0.5)


CFG = GateConfig(tolerance=0.01, min_samples=20)


def _counts(**rates) -> dict[str, Counts]:
    return {d: Counts(round(r * 200), 200) for d, r in rates.items()}


def test_planted_degradation_blocked_with_domain_named() -> None:
    champion = _counts(math=0.60, code=0.40, extraction=0.80)
    candidate = _counts(math=0.61, code=0.20, extraction=0.80)
    verdict = decide(candidate, {"champion": champion}, [], None, CFG)
    assert not verdict.promote
    assert [(f.rule, f.domain, f.reference) for f in verdict.findings] == [("regression", "code", "champion")]
    assert verdict.reasons[0].startswith("code: pass@1 0.200 vs champion 0.400 (-20.0 pts")


def test_noise_within_interval_does_not_block() -> None:
    champion = {"math": Counts(60, 100)}
    candidate = {"math": Counts(57, 100)}  # 3 points down, interval straddles 0
    assert decide(candidate, {"champion": champion}, [], None, CFG).promote


def test_planted_reward_hack_blocked() -> None:
    before = _counts(math=0.50, code=0.30)
    after = _counts(math=0.35, code=0.30)
    verdict = decide(after, {}, [0.40, 0.55, 0.80], before, CFG)
    assert not verdict.promote
    (finding,) = verdict.findings
    assert finding.rule == "reward_hacking" and finding.domain == "math"
    assert "train reward rose +0.400" in finding.message


def test_genuine_improvement_promotes() -> None:
    sft = _counts(math=0.30, code=0.20)
    champion = _counts(math=0.35, code=0.20)
    candidate = _counts(math=0.50, code=0.21)
    verdict = decide(candidate, {"champion": champion, "sft": sft}, [0.3, 0.5], sft, CFG)
    assert verdict.promote and verdict.to_dict()["decision"] == "promote"


def test_too_few_holdout_tasks_block() -> None:
    verdict = decide({"math": Counts(5, 10)}, {"sft": {"math": Counts(4, 10)}}, [], None, CFG)
    assert not verdict.promote and verdict.findings[0].rule == "insufficient_data"
