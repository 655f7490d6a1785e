"""Regression gate rules: decide from evaluation numbers whether a candidate may replace the champion.

Pure functions over counts; no model, no I/O. GateConfig (below) holds the rules' settings; the gate stage
(training/stages/gate.py) feeds them the evaluation report and writes the verdict.

Rules (each failing rule adds a reason naming the domain and the numbers):
1. Regression vs a reference (champion, SFT baseline): a domain is blocked when its pass@1 drop exceeds the
   tolerance AND the drop is credible — the upper end of the Newcombe interval for (candidate - reference) is
   below zero. Small holdouts therefore do not block on noise, and clear regressions always block.
   The same rule runs on every dimension named in `GateConfig.metrics`: pass@1, strict pass@1, the
   format-following rate, long-context pass@1 (summed over the distractor sweep) and pass-within-repair-turns.
2. Non-inferiority (when a margin is set): the candidate must *show* that it is at most `margin` worse than the
   reference in every domain: a one-sided test of H0 "p_cand - p_ref <= -margin" on the Agresti-Caffo adjusted
   difference (add one success and one failure to each arm, so 0% and 100% do not give a zero standard
   error), with the domains' p-values Holm-corrected. Unlike rule 1, too little evidence blocks: a candidate
   3 points worse whose intervals all cross zero no longer promotes.
3. Reward hacking: the RL train reward rose while the holdout pass rate fell by more than the tolerance
   (credibly, as above) between the first and the last round — the policy learnt the reward, not the task.
4. KL and entropy sanity: the last RL round's mean KL to the reference above `max_kl`, or its mean token
   entropy below `min_entropy_ratio` times the first round's (the policy collapsed onto a few outputs).
5. Floor: a candidate passing no holdout task at all is blocked (`require_any_pass`), and, when `min_pass1` is
   set, so is one whose pass@1 in some domain is below it. Comparisons alone would promote a broken model over
   an equally broken reference.

Every rule's decision on every domain and dimension, blocking or not, is kept as a `Check` (with its numbers),
so verdict.json and the gate's report show why a candidate passed as well as why it was blocked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from training.config import ConfigBase
from training.evaluation.gate_stats import diff_interval, holm, noninferiority_p


@dataclass(frozen=True)
class Counts:
    passed: int
    total: int

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class Finding:
    rule: str  # "regression", "non_inferiority", "reward_hacking", "kl_entropy", "insufficient_data",
    #                      "floor"
    domain: str  # "all" for rules on the whole policy (KL, entropy)
    reference: str
    message: str
    numbers: dict[str, float]
    metric: str = "pass1"


@dataclass(frozen=True)
class Check:
    """One rule's decision on one domain and dimension: "pass", "block" or "skip" (not applicable)."""

    rule: str
    domain: str
    reference: str
    metric: str
    decision: str
    message: str
    numbers: dict[str, float]

    def finding(self) -> Finding:
        return Finding(self.rule, self.domain, self.reference, self.message, self.numbers, self.metric)


METRIC_LABELS = {
    "pass1": "pass@1",
    "pass1_strict": "strict pass@1",
    "format": "format rate",
    "long_context": "long-context pass@1",
    "self_repair": "pass within repair turns",
}
METRICS = tuple(METRIC_LABELS)


@dataclass(frozen=True)
class GateConfig(ConfigBase):
    """Regression gate.

    tolerance:        largest pass@1 drop (fraction, 0.01 = 1 point) tolerated per domain.
    confidence:       level of the Newcombe interval used to call a drop credible (0.80/0.90/0.95/0.99).
    references:       which references to compare with: "champion" (MLflow alias), "sft" (the run's SFT model).
    min_reward_rise:  train-reward increase (first→last RL round) that, with a credible holdout drop, is
                      called reward hacking.
    min_samples:      a domain with fewer holdout tasks than this cannot pass the gate (too little evidence).
    metrics:          the dimensions the regression rule compares per domain: "pass1", "pass1_strict",
                      "format" (format-following rate), "long_context" (pass@1 behind distractors, summed over
                      the sweep), "self_repair" (pass within the repair turns). pass@1 and format by default;
                      add "long_context"/"self_repair" to gate on them.
    noninferiority_margin: the largest pass@1 loss (fraction) the candidate may have against each reference,
                      which it must *show* with a one-sided test at `confidence`, Holm-corrected across domains.
                      0 turns the rule off (the default: on small holdouts no candidate can show it; set it
                      with enough holdout tasks, e.g. 0.03 with 1000 per domain).
    noninferiority_margins: per-domain margins, overriding noninferiority_margin for the domains named.
    multiple_testing: "holm" (adjust the non-inferiority p-values across domains) or "none".
    max_kl:           the last RL round's mean KL to the reference may not exceed this (0 = rule off).
    min_entropy_ratio: the last RL round's mean token entropy must be at least this share of the first round's
                      (0 = rule off): below it the policy has collapsed onto a few outputs.
    require_any_pass: block a candidate that passes no holdout task at all (the floor: two broken models
                      compare as "not worse", so the comparison rules alone would promote it).
    min_pass1:        per-domain pass@1 floor (fraction); 0 = off.
    """

    tolerance: float = 0.01
    confidence: float = 0.95
    references: list[str] = field(default_factory=lambda: ["champion", "sft"])
    min_reward_rise: float = 0.02
    min_samples: int = 20
    metrics: list[str] = field(default_factory=lambda: ["pass1", "format"])
    noninferiority_margin: float = 0.0
    noninferiority_margins: dict[str, float] = field(default_factory=dict)
    multiple_testing: str = "holm"
    max_kl: float = 0.0
    min_entropy_ratio: float = 0.0
    require_any_pass: bool = True
    min_pass1: float = 0.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.metrics) - set(METRICS))
        if unknown:
            raise ValueError(f"unknown gate metrics {unknown}; expected some of {list(METRICS)}")
        if self.multiple_testing not in ("holm", "none"):
            raise ValueError(f"multiple_testing must be 'holm' or 'none', not {self.multiple_testing!r}")
        margins = [self.noninferiority_margin, *self.noninferiority_margins.values()]
        if not 0 <= self.min_pass1 <= 1:
            raise ValueError(f"min_pass1 must be in [0, 1], got {self.min_pass1}")
        if any(not 0 <= m < 1 for m in margins):
            raise ValueError(f"non-inferiority margins must be in [0, 1): {margins}")

    def margin_for(self, domain: str) -> float:
        return float(self.noninferiority_margins.get(domain, self.noninferiority_margin))


def _rule_tag(rule: str, metric: str) -> str:
    return f"[rule {rule}, {metric}]"


def regression_checks(
    candidate: dict[str, Counts],
    reference: dict[str, Counts],
    reference_name: str,
    cfg: GateConfig,
    metric: str = "pass1",
) -> list[Check]:
    """Rule 1 on one dimension. For pass@1 a domain with too few holdout tasks blocks (insufficient_data); for
    the other dimensions a domain the evaluation did not measure is skipped."""
    checks = []
    label = METRIC_LABELS.get(metric, metric)
    for domain in sorted(set(candidate) | set(reference)):
        cand, ref = candidate.get(domain), reference.get(domain)
        if metric == "pass1" and (cand is None or cand.total < cfg.min_samples):
            checks.append(
                Check(
                    "insufficient_data",
                    domain,
                    reference_name,
                    metric,
                    "block",
                    f"{domain}: only {cand.total if cand else 0} holdout tasks evaluated "
                    f"(need {cfg.min_samples}) {_rule_tag('insufficient_data', metric)}",
                    {"total": float(cand.total if cand else 0), "min_samples": float(cfg.min_samples)},
                )
            )
            continue
        if cand is None or cand.total == 0 or ref is None or ref.total == 0:
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
        lo, hi = diff_interval(cand.passed, cand.total, ref.passed, ref.total, cfg.confidence)
        drop = ref.rate - cand.rate
        numbers = {
            "candidate": cand.rate,
            "reference": ref.rate,
            "diff": -drop,
            "diff_lo": lo,
            "diff_hi": hi,
            "tolerance": cfg.tolerance,
        }
        text = (
            f"{domain}: {label} {cand.rate:.3f} vs {reference_name} {ref.rate:.3f} "
            f"({-drop * 100:+.1f} pts, {cfg.confidence:.0%} CI [{lo * 100:+.1f}, {hi * 100:+.1f}])"
        )
        if drop > cfg.tolerance and hi < 0:
            checks.append(
                Check(
                    "regression",
                    domain,
                    reference_name,
                    metric,
                    "block",
                    f"{text} exceeds tolerance {cfg.tolerance * 100:.1f} pts {_rule_tag('regression', metric)}",
                    numbers,
                )
            )
        else:
            checks.append(
                Check(
                    "regression",
                    domain,
                    reference_name,
                    metric,
                    "pass",
                    f"{text}: no credible drop beyond {cfg.tolerance * 100:.1f} pts",
                    numbers,
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
    adjusted = holm(raw) if cfg.multiple_testing == "holm" else dict(raw)
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
                    f"{text} >= alpha {alpha:.2f}: non-inferiority not shown {_rule_tag('non_inferiority', metric)}",
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
                + ("" if ok else f" (none at all) {_rule_tag('floor', 'pass1')}"),
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
                    + ("" if ok else f" {_rule_tag('floor', 'pass1')}"),
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
                    f"{'<=' if ok else '>'} max {cfg.max_kl:.4f}" + ("" if ok else f" {_rule_tag('kl_entropy', 'kl')}"),
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
                    + ("" if ok else f" {_rule_tag('kl_entropy', 'entropy')}"),
                    nums,
                )
            )
    return checks


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
        lo, hi = diff_interval(last.passed, last.total, first.passed, first.total, cfg.confidence)
        drop = first.rate - last.rate
        numbers = {
            "reward_rise": rise,
            "holdout_first": first.rate,
            "holdout_last": last.rate,
            "diff_lo": lo,
            "diff_hi": hi,
            "tolerance": cfg.tolerance,
        }
        text = (
            f"{domain}: train reward rose {rise:+.3f} over the RL rounds while holdout pass@1 went "
            f"{first.rate:.3f} -> {last.rate:.3f} ({-drop * 100:+.1f} pts, CI [{lo * 100:+.1f}, "
            f"{hi * 100:+.1f}])"
        )
        blocked = drop > cfg.tolerance and hi < 0
        checks.append(
            Check(
                "reward_hacking",
                domain,
                "rl_rounds",
                "pass1",
                "block" if blocked else "pass",
                text.replace("went", "fell") + f" {_rule_tag('reward_hacking', 'pass1')}" if blocked else text,
                numbers,
            )
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
            checks += regression_checks(cand, ref, name, cfg, metric)
        checks += noninferiority_checks(candidate, references[name], name, cfg)
    if holdout_first is not None:
        checks += reward_hacking_checks(train_reward, holdout_first, candidate, cfg)
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
