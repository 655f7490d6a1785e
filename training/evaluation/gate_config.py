"""The gate's settings and records: GateConfig, the counts it reads and the checks it writes.

Torch-free and import-light: the Airflow image copies it for the trigger form's metric labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.config import ConfigBase


@dataclass(frozen=True)
class Counts:
    """Passed out of total; `outcomes` ({task id: passed}) when the evaluation kept them, for paired tests."""

    passed: int
    total: int
    outcomes: dict[str, bool] | None = field(default=None, compare=False, repr=False)

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
    min_samples:      a domain with fewer holdout tasks than this is "not enough evidence": pooled into its group
                      and tested there, not alone (or, with strict_min_samples, blocking).
    strict_min_samples: a domain under min_samples blocks the gate (the rule before groups).
    groups:           {domain: group}: the small domains of a group are pooled and tested as "group:<name>"
                      (tasks may also carry metadata "group"; this setting wins).
    metrics:          the dimensions the regression rule compares per domain: "pass1", "pass1_strict",
                      "format" (format-following rate), "long_context" (pass@1 behind distractors, summed over
                      the sweep), "self_repair" (pass within the repair turns). pass@1 and format by default;
                      add "long_context"/"self_repair" to gate on them.
    noninferiority_margin: the largest pass@1 loss (fraction) the candidate may have against each reference,
                      which it must *show* with a one-sided test at `confidence`, Holm-corrected across domains.
                      0 turns the rule off (the default: on small holdouts no candidate can show it; set it
                      with enough holdout tasks, e.g. 0.03 with 1000 per domain).
    noninferiority_margins: per-domain margins, overriding noninferiority_margin for the domains named.
    multiple_testing: how the family of regression and reward-hacking tests is adjusted: "holm" (family-wise
                      error), "bh" (Benjamini-Hochberg false discovery rate) or "none" (each test alone).
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
    strict_min_samples: bool = False
    groups: dict[str, str] = field(default_factory=dict)
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
        if self.multiple_testing not in ("holm", "bh", "none"):
            raise ValueError(f"multiple_testing must be 'holm', 'bh' or 'none', not {self.multiple_testing!r}")
        margins = [self.noninferiority_margin, *self.noninferiority_margins.values()]
        if not 0 <= self.min_pass1 <= 1:
            raise ValueError(f"min_pass1 must be in [0, 1], got {self.min_pass1}")
        if any(not 0 <= m < 1 for m in margins):
            raise ValueError(f"non-inferiority margins must be in [0, 1): {margins}")

    def margin_for(self, domain: str) -> float:
        return float(self.noninferiority_margins.get(domain, self.noninferiority_margin))


def rule_tag(rule: str, metric: str) -> str:
    return f"[rule {rule}, {metric}]"
