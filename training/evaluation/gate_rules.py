"""Regression gate rules: decide from evaluation numbers whether a candidate may replace the champion.

Pure functions over counts; no model, no I/O. GateConfig (below) holds the rules' settings; the gate stage
(training/stages/gate.py) feeds them the evaluation report and writes the verdict.

Rules (each failing rule adds a reason naming the domain and the numbers):
1. Regression vs a reference (champion, SFT baseline): a domain is blocked when its pass@1 drop exceeds the
   tolerance AND the drop is credible: the one-sided test of "the candidate is not worse" rejects at
   alpha = 1 - confidence after adjustment across the whole family (below). When both models' evaluations
   kept per-task outcomes (they do since paired gating) the test is paired on the task ids both answered:
   the exact McNemar test on the discordant tasks, with Newcombe's paired interval shown; the drop is measured
   on those shared tasks and the check says how many were paired. Without outcomes (older reports) it falls
   back to the unpaired Agresti-Caffo test and Newcombe's unpaired interval.
   The same rule runs on every dimension named in `GateConfig.metrics`: pass@1, strict pass@1, the
   format-following rate, long-context pass@1 (summed over the distractor sweep) and pass-within-repair-turns.
   A domain with fewer than `min_samples` holdout tasks is "not enough evidence": it does not block on its
   own but is pooled with the other small domains of its group (`GateConfig.groups`, or the tasks' own
   metadata "group") and the group is tested as one; `strict_min_samples` makes such a domain block as before.
   Every domain pooled is tested too (domain "all"): a fall spread thin over many domains, none credible
   alone, still blocks. When nothing has enough tasks, nothing was compared and the gate blocks.
2. Non-inferiority (when a margin is set): the candidate must *show* that it is at most `margin` worse than the
   reference in every domain: a one-sided test of H0 "p_cand - p_ref <= -margin" on the Agresti-Caffo adjusted
   difference (add one success and one failure to each arm, so 0% and 100% do not give a zero standard
   error), with the domains' p-values Holm-corrected. Unlike rule 1, too little evidence blocks: a candidate
   3 points worse whose intervals all cross zero no longer promotes.
3. Reward hacking: the RL train reward rose while the holdout pass rate fell by more than the tolerance
   (credibly, tested as in rule 1 and in the same family) between the first and the last round: the policy
   learnt the reward, not the task.
4. KL and entropy sanity: the last RL round's mean KL to the reference above `max_kl`, or its mean token
   entropy below `min_entropy_ratio` times the first round's (the policy collapsed onto a few outputs).
5. Floor: a candidate passing no holdout task at all is blocked (`require_any_pass`), and, when `min_pass1` is
   set, so is one whose pass@1 in some domain is below it. Comparisons alone would promote a broken model over
   an equally broken reference.

Error control across the family: every regression and reward-hacking test the gate runs (reference x domain
or group x dimension) is one family, adjusted together by `multiple_testing`: "holm" (the default) bounds the
chance that an equal candidate is blocked by anything at alpha however many domains there are; "bh"
(Benjamini-Hochberg) bounds the expected share of wrong blocks among the blocks, which lets more true
regressions through to a block at a hundred domains but no longer bounds the chance of blocking a good
candidate, so it is not the default. Each check keeps its raw p-value ("p") and the adjusted one
("p_adjusted"). The non-inferiority tests (rule 2) are their own Holm family: there a small p-value promotes.

Every rule's decision on every domain and dimension, blocking or not, is kept as a `Check` (with its numbers),
so verdict.json and the gate's report show why a candidate passed as well as why it was blocked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from training.evaluation.gate_config import (
    METRIC_LABELS,
    METRICS,
    Check,
    Counts,
    Finding,
    GateConfig,
    rule_tag,
)
from training.evaluation.gate_regression import (
    adjust_family,
    compare_counts,
    compare_domains,
    regression_checks,
    reward_hacking,
    reward_hacking_checks,
)
from training.evaluation.gate_stats import holm, noninferiority_p

__all__ = [
    "METRICS",
    "METRIC_LABELS",
    "Check",
    "Counts",
    "Finding",
    "GateConfig",
    "Verdict",
    "adjust_family",
    "compare_counts",
    "compare_domains",
    "decide",
    "floor_checks",
    "noninferiority_checks",
    "policy_sanity_checks",
    "regression_checks",
    "reward_hacking",
    "reward_hacking_checks",
]


def noninferiority_checks(
    candidate: dict[str, Counts],
    reference: dict[str, Counts],
    reference_name: str,
    cfg: GateConfig,
    metric: str = "pass1",
) -> list[Check]:
    """Rule 2: per domain with a margin > 0 (cfg.margin_for), a one-sided non-inferiority test; the p-values
    of the tested domains are Holm-corrected together (cfg.multiple_testing == "holm"), and a domain whose
    adjusted p-value is not below 1 - confidence blocks."""
    alpha = 1 - cfg.confidence
    raw: dict[str, float] = {}
    numbers: dict[str, dict[str, float]] = {}
    for domain in sorted(set(candidate) & set(reference)):
        cand, ref, margin = candidate[domain], reference[domain], cfg.margin_for(domain)
        if margin <= 0 or not cand.total or not ref.total:
            continue
        raw[domain] = noninferiority_p(cand.passed, cand.total, ref.passed, ref.total, margin)
        # the one-sided (1 - alpha) lower bound of the adjusted difference: non-inferior when above -margin
        pc, pr = (cand.passed + 1) / (cand.total + 2), (ref.passed + 1) / (ref.total + 2)
        se = math.sqrt(pc * (1 - pc) / (cand.total + 2) + pr * (1 - pr) / (ref.total + 2))
        z = {0.80: 0.8416, 0.90: 1.2816, 0.95: 1.6449, 0.99: 2.3263}.get(cfg.confidence, 1.6449)
        numbers[domain] = {
            "candidate": cand.rate,
            "reference": ref.rate,
            "diff": cand.rate - ref.rate,
            "margin": margin,
            "diff_lower_one_sided": pc - pr - z * se,
            "p": raw[domain],
        }
    adjusted = holm(raw) if cfg.multiple_testing != "none" else dict(raw)
    checks = []
    label = METRIC_LABELS.get(metric, metric)
    for domain in sorted(raw):
        nums = {**numbers[domain], "p_adjusted": adjusted[domain], "alpha": alpha}
        text = (
            f"{domain}: {label} {nums['candidate']:.3f} vs {reference_name} {nums['reference']:.3f} "
            f"({nums['diff'] * 100:+.1f} pts), non-inferiority margin {nums['margin'] * 100:.1f} pts: "
            f"p = {nums['p']:.4f}, {cfg.multiple_testing}-adjusted {adjusted[domain]:.4f}"
        )
        if adjusted[domain] < alpha:
            checks.append(
                Check(
                    "non_inferiority",
                    domain,
                    reference_name,
                    metric,
                    "pass",
                    f"{text} < alpha {alpha:.2f}: non-inferior",
                    nums,
                )
            )
        else:
            checks.append(
                Check(
                    "non_inferiority",
                    domain,
                    reference_name,
                    metric,
                    "block",
                    f"{text} >= alpha {alpha:.2f}: non-inferiority not shown {rule_tag('non_inferiority', metric)}",
                    nums,
                )
            )
    return checks


def floor_checks(candidate: dict[str, Counts], cfg: GateConfig) -> list[Check]:
    """Rule 5, the floor: a candidate that passes no holdout task at all is not a model anyone should serve,
    however it compares (two broken models are "not worse" than each other); and, when cfg.min_pass1 > 0, each
    domain's pass@1 must reach it."""
    checks = []
    passed = sum(c.passed for c in candidate.values())
    total = sum(c.total for c in candidate.values())
    if cfg.require_any_pass:
        ok = passed > 0
        checks.append(
            Check(
                "floor",
                "all",
                "none",
                "pass1",
                "pass" if ok else "block",
                f"all: the candidate passes {passed}/{total} holdout tasks"
                + ("" if ok else f" (none at all) {rule_tag('floor', 'pass1')}"),
                {"passed": passed, "total": total},
            )
        )
    if cfg.min_pass1 > 0:
        for domain, c in sorted(candidate.items()):
            rate = c.passed / c.total if c.total else 0.0
            ok = rate >= cfg.min_pass1
            checks.append(
                Check(
                    "floor",
                    domain,
                    "none",
                    "pass1",
                    "pass" if ok else "block",
                    f"{domain}: pass@1 {c.passed}/{c.total} ({rate:.1%}) "
                    f"{'>=' if ok else '<'} floor {cfg.min_pass1:.1%}"
                    + ("" if ok else f" {rule_tag('floor', 'pass1')}"),
                    {"pass1": rate, "min_pass1": cfg.min_pass1},
                )
            )
    return checks


def policy_sanity_checks(rounds: list[dict[str, Any]], cfg: GateConfig) -> list[Check]:
    """Rule 4 on the RL rounds' summaries ("kl_ref_mean", "entropy_mean" per round): the last round's KL to
    the reference at most cfg.max_kl, and its entropy at least cfg.min_entropy_ratio times the first round's.
    A bound of 0 turns its half off; a round without the figure skips it."""
    checks = []
    if cfg.max_kl > 0:
        kls = [float(r["kl_ref_mean"]) for r in rounds if r.get("kl_ref_mean") is not None]
        if not kls:
            checks.append(
                Check(
                    "kl_entropy",
                    "all",
                    "rl_rounds",
                    "kl",
                    "skip",
                    "no KL to the reference recorded (beta 0 or no RL round)",
                    {},
                )
            )
        else:
            nums = {"kl_last": kls[-1], "max_kl": cfg.max_kl}
            ok = kls[-1] <= cfg.max_kl
            checks.append(
                Check(
                    "kl_entropy",
                    "all",
                    "rl_rounds",
                    "kl",
                    "pass" if ok else "block",
                    f"all: last RL round's mean KL to the reference {kls[-1]:.4f} "
                    f"{'<=' if ok else '>'} max {cfg.max_kl:.4f}" + ("" if ok else f" {rule_tag('kl_entropy', 'kl')}"),
                    nums,
                )
            )
    if cfg.min_entropy_ratio > 0:
        ents = [float(r["entropy_mean"]) for r in rounds if r.get("entropy_mean") is not None]
        if len(ents) < 1 or ents[0] <= 0:
            checks.append(
                Check(
                    "kl_entropy",
                    "all",
                    "rl_rounds",
                    "entropy",
                    "skip",
                    "no policy entropy recorded for the RL rounds",
                    {},
                )
            )
        else:
            ratio = ents[-1] / ents[0]
            nums = {
                "entropy_first": ents[0],
                "entropy_last": ents[-1],
                "ratio": ratio,
                "min_entropy_ratio": cfg.min_entropy_ratio,
            }
            ok = ratio >= cfg.min_entropy_ratio
            checks.append(
                Check(
                    "kl_entropy",
                    "all",
                    "rl_rounds",
                    "entropy",
                    "pass" if ok else "block",
                    f"all: policy entropy {ents[0]:.3f} -> {ents[-1]:.3f} nats/token over the RL "
                    f"rounds (ratio {ratio:.2f} {'>=' if ok else '<'} min {cfg.min_entropy_ratio:.2f})"
                    + ("" if ok else f" {rule_tag('kl_entropy', 'entropy')}"),
                    nums,
                )
            )
    return checks


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reasons: list[str]
    findings: list[Finding]
    checks: list[Check] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "promote": self.promote,
            "decision": "promote" if self.promote else "block",
            "reasons": self.reasons,
            "findings": [f.__dict__ for f in self.findings],
            "checks": [c.__dict__ for c in self.checks],
        }


def decide(
    candidate: dict[str, Counts],
    references: dict[str, dict[str, Counts]],
    train_reward: list[float],
    holdout_first: dict[str, Counts] | None,
    cfg: GateConfig,
    dimensions: dict[str, dict[str, dict[str, Counts]]] | None = None,
    rounds: list[dict[str, Any]] | None = None,
    groups: dict[str, str] | None = None,
) -> Verdict:
    """The verdict: promote only when no rule blocks. `candidate` and `references` ("champion", "sft" -> counts)
    are pass@1; `dimensions` maps another dimension of cfg.metrics ("format", "long_context", ...) to
    {model name: counts per domain}; `rounds` are the RL rounds' summaries (KL, entropy)."""
    checks: list[Check] = []
    for name in cfg.references:
        if name not in references:
            continue
        for metric in cfg.metrics:
            if metric == "pass1":
                cand, ref = candidate, references[name]
            elif dimensions and metric in dimensions and "candidate" in dimensions[metric]:
                cand, ref = dimensions[metric]["candidate"], dimensions[metric].get(name, {})
            else:
                continue
            checks += regression_checks(cand, ref, name, cfg, metric, groups)
        checks += noninferiority_checks(candidate, references[name], name, cfg)
    if holdout_first is not None:
        checks += reward_hacking_checks(train_reward, holdout_first, candidate, cfg)
    checks = adjust_family(checks, cfg)
    checks += policy_sanity_checks(rounds or [], cfg)
    checks += floor_checks(candidate, cfg)
    unique: dict[tuple[str, str, str, str], Finding] = {}
    for c in checks:  # insufficient_data is found once per reference; report it once
        if c.decision == "block":
            f = c.finding()
            unique.setdefault((f.rule, f.domain, "" if f.rule == "insufficient_data" else f.reference, f.metric), f)
    kept = list(unique.values())
    return Verdict(
        promote=not kept,
        reasons=[f.message for f in kept] or ["no rule blocks the candidate"],
        findings=kept,
        checks=checks,
    )
