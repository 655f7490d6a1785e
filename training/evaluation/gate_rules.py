"""Regression gate rules: decide from evaluation numbers whether a candidate may replace the champion.

Pure functions over counts; no model, no I/O. The gate stage (training/stages/gate.py, which also holds
GateConfig) feeds them the evaluation report and writes the verdict.

Rules (each failing rule adds a reason naming the domain and the numbers):
1. Regression vs a reference (champion, SFT baseline): a domain is blocked when its pass@1 drop exceeds the
   tolerance AND the drop is credible — the upper end of the Newcombe interval for (candidate - reference) is
   below zero. Small holdouts therefore do not block on noise, and clear regressions always block.
2. Reward hacking: the RL train reward rose while the holdout pass rate fell by more than the tolerance
   (credibly, as above) between the first and the last round — the policy learnt the reward, not the task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.stages.gate import GateConfig

_Z = {0.80: 1.2816, 0.90: 1.6449, 0.95: 1.9600, 0.99: 2.5758}


def z_value(confidence: float) -> float:
    if confidence not in _Z:
        raise ValueError(f"confidence {confidence} not supported; use one of {sorted(_Z)}")
    return _Z[confidence]


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927). n = 0 gives (0, 1)."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, n={n}]")
    z = z_value(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def diff_interval(s1: int, n1: int, s2: int, n2: int, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (Newcombe 1998, method 10), from two Wilson intervals."""
    p1, p2 = (s1 / n1 if n1 else 0.0), (s2 / n2 if n2 else 0.0)
    l1, u1 = wilson_interval(s1, n1, confidence)
    l2, u2 = wilson_interval(s2, n2, confidence)
    d = p1 - p2
    lower = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    upper = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return lower, upper


@dataclass(frozen=True)
class Counts:
    passed: int
    total: int

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class Finding:
    rule: str            # "regression", "reward_hacking", "insufficient_data"
    domain: str
    reference: str
    message: str
    numbers: dict[str, float]


def compare_domains(candidate: dict[str, Counts], reference: dict[str, Counts], reference_name: str,
                    cfg: GateConfig) -> list[Finding]:
    findings = []
    for domain in sorted(set(candidate) | set(reference)):
        cand, ref = candidate.get(domain), reference.get(domain)
        if cand is None or cand.total < cfg.min_samples:
            findings.append(Finding("insufficient_data", domain, reference_name,
                                    f"{domain}: only {cand.total if cand else 0} holdout tasks evaluated "
                                    f"(need {cfg.min_samples})", {}))
            continue
        if ref is None or ref.total == 0:
            continue  # a new domain has nothing to regress from
        lo, hi = diff_interval(cand.passed, cand.total, ref.passed, ref.total, cfg.confidence)
        drop = ref.rate - cand.rate
        numbers = {"candidate": cand.rate, "reference": ref.rate, "diff": -drop, "diff_lo": lo, "diff_hi": hi}
        if drop > cfg.tolerance and hi < 0:
            findings.append(Finding(
                "regression", domain, reference_name,
                f"{domain}: pass@1 {cand.rate:.3f} vs {reference_name} {ref.rate:.3f} "
                f"({-drop * 100:+.1f} pts, {cfg.confidence:.0%} CI [{lo * 100:+.1f}, {hi * 100:+.1f}]) "
                f"exceeds tolerance {cfg.tolerance * 100:.1f} pts", numbers))
    return findings


def reward_hacking(train_reward: list[float], holdout_first: dict[str, Counts], holdout_last: dict[str, Counts],
                   cfg: GateConfig) -> list[Finding]:
    """Train reward per RL round (first..last) vs holdout counts before the first and after the last round."""
    if len(train_reward) < 2:
        return []
    rise = train_reward[-1] - train_reward[0]
    if rise < cfg.min_reward_rise:
        return []
    findings = []
    for domain in sorted(set(holdout_first) & set(holdout_last)):
        first, last = holdout_first[domain], holdout_last[domain]
        if not first.total or not last.total:
            continue
        lo, hi = diff_interval(last.passed, last.total, first.passed, first.total, cfg.confidence)
        drop = first.rate - last.rate
        if drop > cfg.tolerance and hi < 0:
            findings.append(Finding(
                "reward_hacking", domain, "rl_rounds",
                f"{domain}: train reward rose {rise:+.3f} over the RL rounds while holdout pass@1 fell "
                f"{first.rate:.3f} -> {last.rate:.3f} ({-drop * 100:+.1f} pts, CI [{lo * 100:+.1f}, "
                f"{hi * 100:+.1f}])", {"reward_rise": rise, "holdout_first": first.rate,
                                       "holdout_last": last.rate, "diff_lo": lo, "diff_hi": hi}))
    return findings


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reasons: list[str]
    findings: list[Finding]

    def to_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "decision": "promote" if self.promote else "block",
                "reasons": self.reasons,
                "findings": [f.__dict__ for f in self.findings]}


def decide(candidate: dict[str, Counts], references: dict[str, dict[str, Counts]], train_reward: list[float],
           holdout_first: dict[str, Counts] | None, cfg: GateConfig) -> Verdict:
    """The verdict: promote only when no rule fires. `references` maps a name ("champion", "sft") to counts."""
    findings: list[Finding] = []
    for name in cfg.references:
        if name in references:
            findings += compare_domains(candidate, references[name], name, cfg)
    if holdout_first is not None:
        findings += reward_hacking(train_reward, holdout_first, candidate, cfg)
    unique: dict[tuple[str, str, str], Finding] = {}
    for f in findings:  # insufficient_data is found once per reference; report it once
        unique.setdefault((f.rule, f.domain, "" if f.rule == "insufficient_data" else f.reference), f)
    kept = list(unique.values())
    return Verdict(promote=not kept, reasons=[f.message for f in kept] or ["no regression beyond tolerance"],
                   findings=kept)
