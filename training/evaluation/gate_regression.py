"""Rules 1 and 3 of the gate (regression vs a reference, reward hacking) and their family-wise adjustment.

Both ask "is the candidate credibly worse?", so both are one-sided tests of the same kind, paired on shared task
ids when the evaluation kept per-task outcomes, and all of them together are one multiple-testing family
(training/evaluation/gate_rules.py describes the rules; gate_stats.py holds the statistics).
"""

from __future__ import annotations

from dataclasses import replace

from training.evaluation.gate_config import METRIC_LABELS, Check, Counts, Finding, GateConfig, rule_tag
from training.evaluation.gate_stats import adjust, diff_interval, inferiority_p, mcnemar_p, paired_diff_interval


def compare_counts(cand: Counts, ref: Counts, confidence: float = 0.95) -> dict[str, float]:
    """The numbers of one candidate-vs-reference comparison: rates, the drop, its interval and the one-sided
    p-value of "the candidate is not worse", paired on the shared task ids when both kept outcomes."""
    shared = set(cand.outcomes) & set(ref.outcomes) if cand.outcomes and ref.outcomes else set()
    if shared:
        table = {(a, b): 0 for a in (True, False) for b in (True, False)}
        for task in shared:
            table[bool(cand.outcomes[task]), bool(ref.outcomes[task])] += 1  # type: ignore[index]
        both, cand_only = table[True, True], table[True, False]
        ref_only, neither = table[False, True], table[False, False]
        n = len(shared)
        lo, hi = paired_diff_interval(both, cand_only, ref_only, neither, confidence)
        return {
            "candidate": (both + cand_only) / n,
            "reference": (both + ref_only) / n,
            "diff": (cand_only - ref_only) / n,
            "paired": float(n),
            "worse": float(ref_only),
            "better": float(cand_only),
            "p": mcnemar_p(ref_only, cand_only),
            "diff_lo": lo,
            "diff_hi": hi,
        }
    lo, hi = diff_interval(cand.passed, cand.total, ref.passed, ref.total, confidence)
    return {
        "candidate": cand.rate,
        "reference": ref.rate,
        "diff": cand.rate - ref.rate,
        "paired": 0.0,
        "p": inferiority_p(cand.passed, cand.total, ref.passed, ref.total),
        "diff_lo": lo,
        "diff_hi": hi,
    }


def _pool(members: list[Counts]) -> Counts:
    outcomes: dict[str, bool] | None = {}
    for c in members:
        if c.outcomes is None:
            outcomes = None
            break
        outcomes.update(c.outcomes)  # type: ignore[union-attr]
    return Counts(sum(c.passed for c in members), sum(c.total for c in members), outcomes)


def _harm_check(
    rule: str,
    domain: str,
    reference_name: str,
    metric: str,
    cand: Counts,
    ref: Counts,
    cfg: GateConfig,
    extra: dict[str, float] | None = None,
) -> Check:
    numbers = {**compare_counts(cand, ref, cfg.confidence), **(extra or {})}
    numbers["tolerance"] = cfg.tolerance
    check = Check(rule, domain, reference_name, metric, "pass", "", numbers)
    return settle(check, numbers["p"], cfg, "none")


def settle(check: Check, p_adjusted: float, cfg: GateConfig, method: str) -> Check:
    """A harm-family check's decision and message from its (adjusted) p-value: it blocks when the drop exceeds
    the tolerance and the adjusted p-value is below alpha = 1 - confidence."""
    n = check.numbers
    alpha = 1 - cfg.confidence
    drop = -n["diff"]
    blocked = drop > cfg.tolerance and p_adjusted < alpha
    label = METRIC_LABELS.get(check.metric, check.metric)
    paired = int(n.get("paired", 0))
    how = f"paired on {paired} tasks" if paired else "unpaired"
    p_text = f"p = {n['p']:.3g}" + (f", {method}-adjusted {p_adjusted:.3g}" if method != "none" else "")
    ci = f"{cfg.confidence:.0%} CI [{n['diff_lo'] * 100:+.1f}, {n['diff_hi'] * 100:+.1f}]"
    if check.rule == "reward_hacking":
        text = (
            f"{check.domain}: train reward rose {n['reward_rise']:+.3f} over the RL rounds while holdout pass@1 "
            f"went {n['reference']:.3f} -> {n['candidate']:.3f} ({n['diff'] * 100:+.1f} pts, {ci}, {how}, {p_text})"
        )
        message = text.replace("went", "fell") + f" {rule_tag('reward_hacking', 'pass1')}" if blocked else text
    else:
        text = (
            f"{check.domain}: {label} {n['candidate']:.3f} vs {check.reference} {n['reference']:.3f} "
            f"({n['diff'] * 100:+.1f} pts, {ci}, {how}, {p_text})"
        )
        message = (
            f"{text} exceeds tolerance {cfg.tolerance * 100:.1f} pts {rule_tag('regression', check.metric)}"
            if blocked
            else f"{text}: no credible drop beyond {cfg.tolerance * 100:.1f} pts"
        )
    numbers = {**n, "p_adjusted": p_adjusted, "alpha": alpha}
    return replace(check, decision="block" if blocked else "pass", message=message, numbers=numbers)


def regression_checks(
    candidate: dict[str, Counts],
    reference: dict[str, Counts],
    reference_name: str,
    cfg: GateConfig,
    metric: str = "pass1",
    groups: dict[str, str] | None = None,
) -> list[Check]:
    """Rule 1 on one dimension, each test judged alone (decide() adjusts them as one family). A domain under
    cfg.min_samples is pooled into its group (groups, then cfg.groups win) or, strict, blocks; for pass@1 it is
    reported as "insufficient_data". A domain the evaluation did not measure for both models is skipped."""
    checks = []
    label = METRIC_LABELS.get(metric, metric)
    group_of = {**(groups or {}), **cfg.groups}
    pooled: dict[str, tuple[list[Counts], list[Counts], list[str]]] = {}
    for domain in sorted(set(candidate) | set(reference)):
        cand, ref = candidate.get(domain), reference.get(domain)
        if cand is None or cand.total < cfg.min_samples:
            n = cand.total if cand else 0
            group = group_of.get(domain)
            if cand is not None and ref is not None and ref.total and group:
                slot = pooled.setdefault(group, ([], [], []))
                slot[0].append(cand)
                slot[1].append(ref)
                slot[2].append(domain)
            if metric == "pass1":
                blocks = cfg.strict_min_samples
                where = f"pooled into group {group!r}" if group else "no group to pool it into"
                checks.append(
                    Check(
                        "insufficient_data",
                        domain,
                        reference_name,
                        metric,
                        "block" if blocks else "skip",
                        f"{domain}: only {n} holdout tasks evaluated (need {cfg.min_samples}): "
                        + (
                            f"too little evidence {rule_tag('insufficient_data', metric)}"
                            if blocks
                            else f"not enough evidence, {where}"
                        ),
                        {"total": float(n), "min_samples": float(cfg.min_samples)},
                    )
                )
            continue
        if cand.total == 0 or ref is None or ref.total == 0:
            checks.append(
                Check(
                    "regression",
                    domain,
                    reference_name,
                    metric,
                    "skip",
                    f"{domain}: {label} not measured for both models",
                    {},
                )
            )
            continue  # a new domain (or one without this dimension) has nothing to regress from
        checks.append(_harm_check("regression", domain, reference_name, metric, cand, ref, cfg))
    for group, (cands, refs, members) in sorted(pooled.items()):
        cand, ref = _pool(cands), _pool(refs)
        name = f"group:{group}"
        if cand.total < cfg.min_samples:
            if metric == "pass1":
                checks.append(
                    Check(
                        "insufficient_data",
                        name,
                        reference_name,
                        metric,
                        "skip",
                        f"{name}: its small domains ({', '.join(members)}) pool only {cand.total} holdout tasks "
                        f"(need {cfg.min_samples}): not enough evidence",
                        {"total": float(cand.total), "min_samples": float(cfg.min_samples)},
                    )
                )
            continue
        checks.append(_harm_check("regression", name, reference_name, metric, cand, ref, cfg))
    # every domain together: a fall spread thin over many domains, none of them credible alone, is still a fall
    measured = [d for d in sorted(set(candidate) & set(reference)) if candidate[d].total and reference[d].total]
    if len(measured) > 1:
        cand, ref = _pool([candidate[d] for d in measured]), _pool([reference[d] for d in measured])
        if cand.total >= cfg.min_samples:
            checks.append(_harm_check("regression", "all", reference_name, metric, cand, ref, cfg))
    if (
        metric == "pass1"
        and candidate
        and not any(c.rule == "regression" and "p" in c.numbers for c in checks)
        and not cfg.strict_min_samples
    ):
        checks.append(
            Check(
                "insufficient_data",
                "all",
                reference_name,
                metric,
                "block",
                f"all: no domain or group has {cfg.min_samples} holdout tasks: nothing was compared "
                f"{rule_tag('insufficient_data', metric)}",
                {"min_samples": float(cfg.min_samples)},
            )
        )
    return checks


def compare_domains(
    candidate: dict[str, Counts],
    reference: dict[str, Counts],
    reference_name: str,
    cfg: GateConfig,
    metric: str = "pass1",
) -> list[Finding]:
    """The blocking findings of rule 1 (regression) on one dimension."""
    return [
        c.finding()
        for c in regression_checks(candidate, reference, reference_name, cfg, metric)
        if c.decision == "block"
    ]


def reward_hacking_checks(
    train_reward: list[float], holdout_first: dict[str, Counts], holdout_last: dict[str, Counts], cfg: GateConfig
) -> list[Check]:
    """Rule 3. Train reward per RL round (first..last) vs holdout counts before the first and after the last
    round."""
    if len(train_reward) < 2:
        return [
            Check(
                "reward_hacking",
                "all",
                "rl_rounds",
                "pass1",
                "skip",
                f"{len(train_reward)} RL round(s) with a train reward: nothing to compare",
                {},
            )
        ]
    rise = train_reward[-1] - train_reward[0]
    if rise < cfg.min_reward_rise:
        return [
            Check(
                "reward_hacking",
                "all",
                "rl_rounds",
                "pass1",
                "pass",
                f"train reward rose {rise:+.3f} over the RL rounds (< {cfg.min_reward_rise:.3f}): "
                "no reward rise to explain",
                {"reward_rise": rise, "min_reward_rise": cfg.min_reward_rise},
            )
        ]
    checks = []
    for domain in sorted(set(holdout_first) & set(holdout_last)):
        first, last = holdout_first[domain], holdout_last[domain]
        if not first.total or not last.total:
            continue
        checks.append(
            _harm_check("reward_hacking", domain, "rl_rounds", "pass1", last, first, cfg, {"reward_rise": rise})
        )
    return checks


def reward_hacking(
    train_reward: list[float], holdout_first: dict[str, Counts], holdout_last: dict[str, Counts], cfg: GateConfig
) -> list[Finding]:
    """The blocking findings of rule 3 (reward hacking)."""
    return [
        c.finding()
        for c in reward_hacking_checks(train_reward, holdout_first, holdout_last, cfg)
        if c.decision == "block"
    ]


HARM_RULES = ("regression", "reward_hacking")


def adjust_family(checks: list[Check], cfg: GateConfig) -> list[Check]:
    """Every regression and reward-hacking test among `checks` adjusted as one family (cfg.multiple_testing),
    each re-decided on its adjusted p-value; the other checks are returned unchanged, order kept."""
    family = {i: c.numbers["p"] for i, c in enumerate(checks) if c.rule in HARM_RULES and "p" in c.numbers}
    adjusted = adjust({str(i): p for i, p in family.items()}, cfg.multiple_testing)
    family_size = float(len(family))
    out = []
    for i, c in enumerate(checks):
        if i in family:
            c = settle(c, adjusted[str(i)], cfg, cfg.multiple_testing)
            c = replace(c, numbers={**c.numbers, "family": family_size})
        out.append(c)
    return out
