"""The gate's paired tests, its family-wise error control and its handling of small domains.

Outcomes are built by hand (which task each model passed), so every count below can be checked by reading.
"""

from __future__ import annotations

import pytest

from training.evaluation.gate_rules import Counts, GateConfig, decide, regression_checks
from training.evaluation.gate_stats import holm, mcnemar_p

CFG = GateConfig(tolerance=0.01, min_samples=20, metrics=["pass1"])


def paired(domain: str, both: int, cand_only: int, ref_only: int, neither: int) -> tuple[Counts, Counts]:
    """Candidate and reference counts over the same task ids, with the 2x2 table given."""
    cand: dict[str, bool] = {}
    ref: dict[str, bool] = {}
    cells = [(True, True, both), (True, False, cand_only), (False, True, ref_only), (False, False, neither)]
    i = 0
    for c, r, n in cells:
        for _ in range(n):
            cand[f"{domain}-{i}"], ref[f"{domain}-{i}"] = c, r
            i += 1
    return Counts(sum(cand.values()), i, cand), Counts(sum(ref.values()), i, ref)


def test_a_drop_that_agreement_makes_credible_blocks_only_when_paired() -> None:
    # 200 tasks, 170 answered alike; the candidate loses 22 tasks and gains 8: -7 points.
    cand, ref = paired("math", 80, 8, 22, 90)
    unpaired = decide(
        {"math": Counts(cand.passed, 200)}, {"champion": {"math": Counts(ref.passed, 200)}}, [], None, CFG
    )
    assert unpaired.promote  # 88/200 vs 102/200 unpaired: the interval crosses zero
    verdict = decide({"math": cand}, {"champion": {"math": ref}}, [], None, CFG)
    assert not verdict.promote
    (check,) = [c for c in verdict.checks if c.rule == "regression"]
    assert check.numbers["paired"] == 200 and check.numbers["worse"] == 22 and check.numbers["better"] == 8
    assert check.numbers["p"] == pytest.approx(mcnemar_p(22, 8))  # mid-p 0.0054
    assert check.numbers["diff_hi"] < 0
    assert "paired on 200 tasks" in check.message


def test_pairing_uses_only_the_shared_task_ids() -> None:
    cand, ref = paired("math", 50, 0, 0, 50)
    extra = dict(cand.outcomes or {}, **{f"new-{i}": False for i in range(30)})  # 30 tasks the champion never saw
    cand = Counts(cand.passed, 130, extra)
    (check,) = regression_checks({"math": cand}, {"math": ref}, "champion", CFG)
    assert check.numbers["paired"] == 100
    assert check.numbers["diff"] == 0 and check.decision == "pass"


def test_one_family_across_domains_with_raw_and_adjusted_p() -> None:
    # 100 domains; one has a modest, individually significant drop, which is what noise looks like among 100.
    cands, refs = {}, {}
    for d in range(100):
        c, r = paired(f"d{d:03d}", 60, 8, 8, 24)
        cands[f"d{d:03d}"], refs[f"d{d:03d}"] = c, r
    cands["d007"], refs["d007"] = paired("d007", 60, 3, 12, 25)
    raw_p = mcnemar_p(12, 3)
    assert raw_p < 0.05  # alone, it would block
    verdict = decide(cands, {"champion": refs}, [], None, CFG)
    assert verdict.promote
    regression = [c for c in verdict.checks if c.rule == "regression"]
    assert len(regression) == 101  # the hundred domains and all of them pooled
    assert all("p" in c.numbers and "p_adjusted" in c.numbers and c.numbers["family"] == 101 for c in regression)
    d7 = next(c for c in regression if c.domain == "d007")
    family = {c.domain: c.numbers["p"] for c in regression}
    assert d7.numbers["p_adjusted"] == pytest.approx(holm(family)["d007"])
    alone = decide(cands, {"champion": refs}, [], None, GateConfig(**{**CFG.to_dict(), "multiple_testing": "none"}))
    assert [f.domain for f in alone.findings] == ["d007"]
    # a collapse in one domain of the hundred still blocks after the correction
    cands["d042"], refs["d042"] = paired("d042", 40, 0, 30, 30)
    blocked = decide(cands, {"champion": refs}, [], None, CFG)
    assert [f.domain for f in blocked.findings] == ["d042"]


def test_a_small_domain_is_not_enough_evidence_and_pools_into_its_group() -> None:
    big_c, big_r = paired("math", 60, 10, 10, 20)
    # three small domains of one group, each 10 tasks, each losing 4 of its 10: alone none has the evidence
    cands, refs = {"math": big_c}, {"math": big_r}
    for name in ("fr", "de", "es"):
        cands[name], refs[name] = paired(name, 2, 0, 4, 4)
    groups = {"fr": "translation", "de": "translation", "es": "translation"}
    cfg = GateConfig(**{**CFG.to_dict(), "groups": groups})
    verdict = decide(cands, {"champion": refs}, [], None, cfg)
    small = [c for c in verdict.checks if c.rule == "insufficient_data"]
    assert {c.domain for c in small} == {"fr", "de", "es"} and {c.decision for c in small} == {"skip"}
    assert all("not enough evidence, pooled into group 'translation'" in c.message for c in small)
    (group,) = [c for c in verdict.checks if c.domain == "group:translation"]
    assert group.numbers["paired"] == 30 and group.numbers["worse"] == 12
    assert group.decision == "block" and not verdict.promote
    assert {f.domain for f in verdict.findings} == {"group:translation", "all"}
    # without a group the small domains are reported and block nothing alone; every domain pooled still
    # carries their 12 losses
    ungrouped = decide(cands, {"champion": refs}, [], None, CFG)
    assert [f.domain for f in ungrouped.findings] == ["all"]
    assert any("no group to pool it into" in c.message for c in ungrouped.checks)
    # strict: a small domain blocks, as before groups
    strict = decide(cands, {"champion": refs}, [], None, GateConfig(**{**CFG.to_dict(), "strict_min_samples": True}))
    assert {(f.rule, f.domain) for f in strict.findings} == {
        ("insufficient_data", "fr"),
        ("insufficient_data", "de"),
        ("insufficient_data", "es"),
        ("regression", "all"),
    }


def test_a_group_from_the_evaluation_is_used_and_the_config_wins() -> None:
    cands, refs = {}, {}
    for name in ("a", "b"):
        cands[name], refs[name] = paired(name, 5, 0, 5, 2)  # 12 tasks each, 5 lost
    from_report = decide(cands, {"champion": refs}, [], None, CFG, groups={"a": "g", "b": "g"})
    assert [f.domain for f in from_report.findings] == ["group:g", "all"]  # the group is every domain here
    split = GateConfig(**{**CFG.to_dict(), "groups": {"a": "g", "b": "h"}})
    apart = decide(cands, {"champion": refs}, [], None, split, groups={"a": "g", "b": "g"})
    # each group now pools only 12 tasks, not enough evidence; every domain pooled (24) still is
    assert [(f.rule, f.domain) for f in apart.findings] == [("regression", "all")]
    assert {c.domain for c in apart.checks if c.rule == "insufficient_data"} == {"a", "b", "group:g", "group:h"}
    one = decide({"a": cands["a"]}, {"champion": {"a": refs["a"]}}, [], None, CFG)
    assert [(f.rule, f.domain) for f in one.findings] == [("insufficient_data", "all")]  # nothing compared
