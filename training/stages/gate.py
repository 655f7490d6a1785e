"""Stage `gate` (`posttrain gate`): the verdict on the evaluated candidate.

Reads `<run>/evaluate/report.json`, applies the rules in training/evaluation/gate_rules.py and writes
`verdict.json` ({"promote": bool, "decision": "promote"|"block", "reasons": [...], "findings": [...] (the
blocking ones), "checks": [...] (every rule's decision on every domain and dimension, with its numbers)}) and
`verdict.md`, the same as a table for people. The stage succeeds either way: a block is a verdict, not a
failure; the DAG branches on it, and `promote` refuses a blocked candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training import storage
from training.config import ConfigBase
from training.evaluation.gate_rules import METRIC_LABELS, Counts, decide
from training.stage import StageContext

STAGE = "gate"
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



def metric_counts(model_report: dict[str, Any], metric: str) -> dict[str, Counts]:
    """Counts per domain of one dimension of an evaluated model (domains without it are left out)."""
    out = {}
    for d, r in model_report["domains"].items():
        total = int(r["pass1"]["total"])
        if metric in ("pass1", "pass1_strict", "format") and metric in r:
            out[d] = Counts(int(r[metric]["passed"]), int(r[metric]["total"]))
        elif metric == "format" and "format_rate" in r:  # reports before format counts were kept
            out[d] = Counts(round(float(r["format_rate"]) * total), total)
        elif metric == "long_context" and r.get("long_context_sweep"):
            points = r["long_context_sweep"]
            out[d] = Counts(sum(int(p["passed"]) for p in points), sum(int(p["total"]) for p in points))
        elif metric == "long_context" and "long_context" in r:
            out[d] = Counts(int(r["long_context"]["passed"]), int(r["long_context"]["total"]))
        elif metric == "self_repair" and r.get("self_repair", {}).get("pass_within"):
            # pass within all the repair episode's turns (hidden tests), counted by evaluation itself
            within = r["self_repair"]["pass_within"]
            last = within[max(within, key=int)]
            out[d] = Counts(int(last["passed"]), int(last["total"]))
        elif metric == "self_repair" and "self_repair" in r:  # reports before repair episodes
            repaired = max([int(v) for v in r["self_repair"]["repaired_within"].values()] or [0])
            out[d] = Counts(int(r["pass1"]["passed"]) + repaired, total)
    return out


def render_verdict_markdown(verdict: dict[str, Any]) -> str:
    """verdict.md: the decision, then every rule's decision with its numbers."""
    lines = [f"# Gate: {verdict['decision'].upper()} ({verdict.get('candidate_stage')})", ""]
    lines += [f"- {r}" for r in verdict["reasons"]]
    lines += ["", "| rule | reference | domain | dimension | decision | numbers |", "|---|---|---|---|---|---|"]
    for c in verdict.get("checks", []):
        nums = ", ".join(f"{k} {v:.4g}" for k, v in c["numbers"].items())
        lines.append(f"| {c['rule']} | {c['reference']} | {c['domain']} | {c['metric']} | **{c['decision']}** "
                     f"| {nums} |")
    return "\n".join(lines) + "\n"


def verdict_from_report(report: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    models = report["models"]
    candidate = metric_counts(models["candidate"], "pass1")
    references = {name: metric_counts(models[name], "pass1") for name in ("champion", "sft") if name in models}
    rounds = report.get("rounds", [])
    train_reward = [float(r["train_reward_mean"]) for r in rounds if "train_reward_mean" in r]
    # Reward hacking is judged on the RL rounds' own holdout checks: before the first round is the SFT model.
    holdout_first = references.get("sft")
    names = ["candidate", *references]
    dimensions = {m: {n: metric_counts(models[n], m) for n in names} for m in cfg.metrics if m != "pass1"}
    verdict = decide(candidate, references, train_reward, holdout_first, cfg, dimensions, rounds).to_dict()
    verdict["candidate_stage"] = report.get("candidate_stage")
    verdict["candidate_uri"] = models["candidate"]["uri"]
    verdict["compared_with"] = sorted(references)
    return verdict


def body(ctx: StageContext) -> dict[str, Any]:
    cfg: GateConfig = ctx.config  # type: ignore[assignment]
    report = storage.read_json(ctx.input("evaluate"), "report.json")
    verdict = verdict_from_report(report, cfg)
    markdown = render_verdict_markdown(verdict)
    ctx.writer.put_json(verdict, "verdict.json")
    ctx.writer.put_bytes(markdown.encode(), "verdict.md")
    ctx.mlflow.log_dict(verdict, "verdict.json")
    ctx.mlflow.log_text(markdown, "verdict.md")
    ctx.mlflow.set_tags({"posttrain.gate": verdict["decision"]})
    for reason in verdict["reasons"]:
        ctx.progress(f"{verdict['decision'].upper()}: {reason}")
    return {"decision": verdict["decision"], "promote": verdict["promote"], "reasons": verdict["reasons"]}


def cli(argv: list[str], prog: str = "posttrain gate") -> int:
    from training.cli import stage_cli

    return stage_cli(argv, prog, "Decide promote/block from the evaluation report.", GateConfig, STAGE, body)
