"""Gate maths against hand-computed and published values; verdicts on planted scenarios."""

from __future__ import annotations

import pytest

from training.evaluation.gate_rules import Counts, GateConfig, decide
from training.evaluation.gate_stats import (
    adjust,
    benjamini_hochberg,
    diff_interval,
    holm,
    inferiority_p,
    mcnemar_p,
    noninferiority_p,
    paired_diff_interval,
    wilson_interval,
)


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
    # the domain, and every domain pooled (a 6.7-point fall overall)
    assert [(f.rule, f.domain, f.reference) for f in verdict.findings] == [
        ("regression", "code", "champion"),
        ("regression", "all", "champion"),
    ]
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


# ----- non-inferiority, Holm, the other dimensions, KL/entropy (issue 16) -------------------------------------
def test_mcnemar_one_sided_exact_and_mid_p_hand_computed() -> None:
    assert mcnemar_p(5, 0, mid=False) == pytest.approx(1 / 32)  # all five discordant pairs against: 0.5**5
    assert mcnemar_p(5, 0) == pytest.approx(1 / 64)  # mid-p: P(X > 5) + P(X = 5) / 2 = 0 + 1/64
    assert mcnemar_p(3, 1, mid=False) == pytest.approx(5 / 16)  # (C(4,3) + C(4,4)) / 16
    assert mcnemar_p(3, 1) == pytest.approx(3 / 16)  # 1/16 + (4/16) / 2
    assert mcnemar_p(0, 4, mid=False) == pytest.approx(1.0)  # P(X >= 0)
    assert mcnemar_p(0, 4) == pytest.approx(1 - 1 / 32)  # 1 - P(X = 0) / 2
    assert mcnemar_p(0, 0) == 1.0
    with pytest.raises(ValueError):
        mcnemar_p(-1, 2)


def test_paired_interval_newcombe_method_10_hand_computed() -> None:
    # 100 tasks: 40 both pass, 5 only the candidate, 15 only the reference, 40 neither: p1 .45, p2 .55.
    # Wilson 95%: 45/100 -> [.356144, .547556], 55/100 -> [.452444, .643856]; phi = (40*40 - 5*15 - 100/2) /
    # sqrt(45*55*55*45) = 1475/2475 = .595960; p1 - l1 = u2 - p2 = .093856, so the lower half-width is
    # .093856 * sqrt(2 * (1 - .595960)) = .084370 and the interval starts at -.1 - .084370.
    lo, hi = paired_diff_interval(40, 5, 15, 40)
    assert lo == pytest.approx(-0.184370, abs=1e-5)
    assert hi == pytest.approx(-0.012304, abs=1e-5)
    # the same margins unpaired cross zero: agreement is what makes the drop credible
    assert diff_interval(45, 100, 55, 100)[1] > 0
    # no correlation (phi = 0 after the continuity correction) gives Newcombe's unpaired interval
    assert paired_diff_interval(25, 25, 25, 25) == pytest.approx(diff_interval(50, 100, 50, 100))


def test_inferiority_p_is_the_other_tail_of_the_zero_margin_test() -> None:
    assert inferiority_p(40, 100, 50, 100) == pytest.approx(1 - noninferiority_p(40, 100, 50, 100, 0.0))
    assert inferiority_p(50, 100, 50, 100) == pytest.approx(0.5)
    assert inferiority_p(1, 0, 1, 10) == 1.0


def test_benjamini_hochberg_hand_computed() -> None:
    # sorted .01, .03, .04 times 3/1, 3/2, 3/3 = .03, .045, .04; step-up minimum from the top: .03, .04, .04
    assert benjamini_hochberg({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.04, "c": 0.04})
    assert adjust({"a": 0.2}, "none") == {"a": 0.2}
    with pytest.raises(ValueError, match="multiple_testing"):
        adjust({}, "bonferroni")


def test_holm_hand_computed() -> None:
    # sorted 0.01, 0.03, 0.04 (m = 3): 3*0.01 = 0.03; 2*0.03 = 0.06; 1*0.04 = 0.04 -> kept monotone at 0.06
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.6, "b": 0.5}) == pytest.approx({"a": 1.0, "b": 1.0})  # 2*0.5 = 1; 0.6 -> max(1, 0.6)
    assert holm({}) == {}


def test_noninferiority_p_hand_computed() -> None:
    # 49/98 vs 49/98: Agresti-Caffo p = 50/100 = 0.5 each; se = sqrt(2 * 0.25/100) = 0.0707107;
    # margin 0.1: z = 0.1/0.0707107 = 1.41421, P(Z > 1.41421) = 0.078650
    assert noninferiority_p(49, 98, 49, 98, 0.10) == pytest.approx(0.078650, abs=1e-5)
    # 48/98 vs 58/98: 0.49 vs 0.59, se = sqrt(0.49*0.51/100 + 0.59*0.41/100) = 0.0701284;
    # z = (-0.10 + 0.05)/0.0701284 = -0.712978, P(Z > -0.712978) = 0.762066
    assert noninferiority_p(48, 98, 58, 98, 0.05) == pytest.approx(0.762066, abs=1e-5)
    assert noninferiority_p(0, 0, 5, 10, 0.05) == 1.0


NI = GateConfig(tolerance=0.05, min_samples=20, noninferiority_margin=0.02, metrics=["pass1"])


def test_three_points_worse_with_tight_intervals_blocked_by_noninferiority() -> None:
    ref = {d: Counts(3000, 5000) for d in ("math", "code", "extraction")}  # 60% on 5000 tasks each
    cand = {d: Counts(2850, 5000) for d in ref}  # 57%: 3 points worse everywhere
    # the regression rule alone (5-point tolerance here) lets it through...
    assert decide(cand, {"sft": ref}, [], None, GateConfig(tolerance=0.05, metrics=["pass1"])).promote
    # ...non-inferiority with a 2-point margin does not: each p ~ 0.84 (see the hand computation above)
    verdict = decide(cand, {"sft": ref}, [], None, NI)
    assert not verdict.promote
    assert [(f.rule, f.domain) for f in verdict.findings] == [
        ("non_inferiority", "code"),
        ("non_inferiority", "extraction"),
        ("non_inferiority", "math"),
    ]
    f = verdict.findings[0]
    assert f.numbers["margin"] == 0.02 and f.numbers["p"] == pytest.approx(0.84476, abs=1e-4)
    assert f.numbers["p_adjusted"] == 1.0  # Holm: the smallest of 3 equal p-values times 3, capped at 1
    assert "non-inferiority margin 2.0 pts" in f.message and "[rule non_inferiority, pass1]" in f.message


def test_three_points_worse_with_wide_intervals_no_longer_promotes() -> None:
    champion, candidate = {"math": Counts(60, 100)}, {"math": Counts(57, 100)}
    verdict = decide(candidate, {"champion": champion}, [], None, GateConfig(noninferiority_margin=0.02))
    assert not verdict.promote and verdict.findings[0].rule == "non_inferiority"


def test_noninferiority_holm_and_per_domain_margins() -> None:
    ref = {"math": Counts(500, 1000), "code": Counts(500, 1000)}
    cand = {"math": Counts(520, 1000), "code": Counts(500, 1000)}
    cfg = GateConfig(noninferiority_margin=0.05, noninferiority_margins={"code": 0.04}, metrics=["pass1"])
    checks = [c for c in decide(cand, {"sft": ref}, [], None, cfg).checks if c.rule == "non_inferiority"]
    by = {c.domain: c.numbers for c in checks}
    assert by["code"]["margin"] == 0.04 and by["math"]["margin"] == 0.05
    raw = {d: noninferiority_p(cand[d].passed, 1000, ref[d].passed, 1000, by[d]["margin"]) for d in by}
    assert {d: n["p_adjusted"] for d, n in by.items()} == pytest.approx(holm(raw))
    assert all(c.decision == "pass" for c in checks)  # 0.5 vs 0.5 at 1000 each shows a 4-point margin
    no_holm = GateConfig(**{**cfg.to_dict(), "multiple_testing": "none"})
    assert sorted(
        c.numbers["p_adjusted"]
        for c in decide(cand, {"sft": ref}, [], None, no_holm).checks
        if c.rule == "non_inferiority"
    ) == pytest.approx(sorted(raw.values()))


def _dims(metric: str, cand: dict[str, Counts], ref: dict[str, Counts]) -> dict:
    return {metric: {"candidate": cand, "sft": ref}}


def test_format_collapse_blocked_by_default() -> None:
    same = _counts(math=0.50, code=0.40)
    fmt_ref, fmt_cand = _counts(math=0.95, code=0.90), _counts(math=0.30, code=0.90)
    verdict = decide(same, {"sft": same}, [], None, CFG, _dims("format", fmt_cand, fmt_ref))
    assert not verdict.promote
    assert [(f.rule, f.metric, f.domain) for f in verdict.findings] == [
        ("regression", "format", "math"),
        ("regression", "format", "all"),
    ]
    assert verdict.reasons[0].startswith("math: format rate 0.300 vs sft 0.950 (-65.0 pts")
    assert verdict.reasons[0].endswith("[rule regression, format]")


def test_better_pass1_worse_long_context_blocked_only_when_that_gate_is_on() -> None:
    sft, cand = _counts(math=0.40, code=0.40), _counts(math=0.55, code=0.45)
    lc_ref, lc_cand = _counts(math=0.40, code=0.35), _counts(math=0.10, code=0.35)
    dims = _dims("long_context", lc_cand, lc_ref)
    assert decide(cand, {"sft": sft}, [], None, CFG, dims).promote  # default metrics: pass1, format
    on = GateConfig(min_samples=20, metrics=["pass1", "format", "long_context"])
    verdict = decide(cand, {"sft": sft}, [], None, on, dims)
    assert not verdict.promote
    f, overall = verdict.findings
    assert (f.rule, f.metric, f.domain) == ("regression", "long_context", "math")
    assert (overall.metric, overall.domain) == ("long_context", "all")
    assert f.numbers["candidate"] == 0.10 and f.numbers["reference"] == 0.40 and f.numbers["diff_hi"] < 0
    assert "long-context pass@1 0.100 vs sft 0.400 (-30.0 pts" in f.message


def test_kl_and_entropy_sanity() -> None:
    same = _counts(math=0.5)
    rounds = [{"kl_ref_mean": 0.02, "entropy_mean": 1.2}, {"kl_ref_mean": 0.35, "entropy_mean": 0.05}]
    assert decide(same, {"sft": same}, [], None, CFG, rounds=rounds).promote  # both bounds off by default
    cfg = GateConfig(min_samples=20, max_kl=0.1, min_entropy_ratio=0.25)
    verdict = decide(same, {"sft": same}, [], None, cfg, rounds=rounds)
    assert [(f.rule, f.metric) for f in verdict.findings] == [("kl_entropy", "kl"), ("kl_entropy", "entropy")]
    assert verdict.findings[0].numbers == {"kl_last": 0.35, "max_kl": 0.1}
    assert verdict.findings[1].numbers["ratio"] == pytest.approx(0.05 / 1.2)
    assert "1.200 -> 0.050 nats/token" in verdict.findings[1].message
    fine = [{"kl_ref_mean": 0.02, "entropy_mean": 1.2}, {"kl_ref_mean": 0.05, "entropy_mean": 0.9}]
    assert decide(same, {"sft": same}, [], None, cfg, rounds=fine).promote
    skipped = decide(same, {"sft": same}, [], None, cfg, rounds=[]).checks
    assert {c.decision for c in skipped if c.rule == "kl_entropy"} == {"skip"}


def test_every_rule_decision_is_recorded_with_numbers() -> None:
    sft, cand = _counts(math=0.30, code=0.20), _counts(math=0.50, code=0.21)
    verdict = decide(
        cand,
        {"sft": sft},
        [0.3, 0.5],
        sft,
        GateConfig(min_samples=20, noninferiority_margin=0.1),
        _dims("format", cand, sft),
    ).to_dict()
    assert verdict["decision"] == "promote"
    rules = {(c["rule"], c["metric"], c["domain"]): c["decision"] for c in verdict["checks"]}
    assert rules[("regression", "pass1", "math")] == "pass" and rules[("regression", "format", "code")] == "pass"
    assert rules[("non_inferiority", "pass1", "code")] == "pass"
    assert rules[("reward_hacking", "pass1", "math")] == "pass"
    assert all(c["numbers"] for c in verdict["checks"] if c["decision"] != "skip")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown gate metrics"):
        GateConfig(metrics=["pass1", "vibes"])
    with pytest.raises(ValueError, match="margins must be in"):
        GateConfig(noninferiority_margins={"math": 1.5})
    with pytest.raises(ValueError, match="multiple_testing"):
        GateConfig(multiple_testing="bonferroni")


def test_floor_blocks_a_candidate_that_passes_nothing_even_against_an_equally_broken_reference() -> None:
    broken = _counts(math=0.0, code=0.0)
    verdict = decide(broken, {"sft": broken}, [], None, CFG)
    assert not verdict.promote
    assert [(f.rule, f.domain) for f in verdict.findings] == [("floor", "all")]
    assert verdict.reasons == ["all: the candidate passes 0/400 holdout tasks (none at all) [rule floor, pass1]"]
    # off on request (a UI smoke test of an 8-step model), and a per-domain floor when set
    assert decide(broken, {"sft": broken}, [], None, GateConfig(min_samples=20, require_any_pass=False)).promote
    weak = _counts(math=0.30, code=0.05)
    floor = decide(weak, {"sft": weak}, [], None, GateConfig(min_samples=20, min_pass1=0.10))
    assert [(f.rule, f.domain, f.numbers["pass1"]) for f in floor.findings] == [("floor", "code", 0.05)]
    with pytest.raises(ValueError, match="min_pass1"):
        GateConfig(min_pass1=1.5)
