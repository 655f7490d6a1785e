"""Stage `gate` (`posttrain gate`): the verdict on the evaluated candidate.

Reads `<run>/evaluate/report.json`, applies the rules in training/evaluation/gate_rules.py and writes
`verdict.json` ({"promote": bool, "decision": "promote"|"block", "reasons": [...], "findings": [...]}). The
stage succeeds either way: a block is a verdict, not a failure; the DAG branches on it, and `promote` refuses
a blocked candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training import storage
from training.config import ConfigBase
from training.evaluation.gate_rules import Counts, decide
from training.stage import StageContext

STAGE = "gate"


@dataclass(frozen=True)
class GateConfig(ConfigBase):
    """Regression gate.

    tolerance:        largest pass@1 drop (fraction, 0.01 = 1 point) tolerated per domain.
    confidence:       level of the Newcombe interval used to call a drop credible (0.80/0.90/0.95/0.99).
    references:       which references to compare with: "champion" (MLflow alias), "sft" (the run's SFT model).
    min_reward_rise:  train-reward increase (first→last RL round) that, with a credible holdout drop, is
                      called reward hacking.
    min_samples:      a domain with fewer holdout tasks than this cannot pass the gate (too little evidence).
    """

    tolerance: float = 0.01
    confidence: float = 0.95
    references: list[str] = field(default_factory=lambda: ["champion", "sft"])
    min_reward_rise: float = 0.02
    min_samples: int = 20



def _counts(model_report: dict[str, Any]) -> dict[str, Counts]:
    return {d: Counts(int(r["pass1"]["passed"]), int(r["pass1"]["total"]))
            for d, r in model_report["domains"].items()}


def verdict_from_report(report: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    models = report["models"]
    candidate = _counts(models["candidate"])
    references = {name: _counts(models[name]) for name in ("champion", "sft") if name in models}
    rounds = report.get("rounds", [])
    train_reward = [float(r["train_reward_mean"]) for r in rounds if "train_reward_mean" in r]
    # Reward hacking is judged on the RL rounds' own holdout checks: before the first round is the SFT model.
    holdout_first = references.get("sft")
    verdict = decide(candidate, references, train_reward, holdout_first, cfg).to_dict()
    verdict["candidate_stage"] = report.get("candidate_stage")
    verdict["candidate_uri"] = models["candidate"]["uri"]
    verdict["compared_with"] = sorted(references)
    return verdict


def body(ctx: StageContext) -> dict[str, Any]:
    cfg: GateConfig = ctx.config  # type: ignore[assignment]
    report = storage.read_json(ctx.input("evaluate"), "report.json")
    verdict = verdict_from_report(report, cfg)
    ctx.writer.put_json(verdict, "verdict.json")
    ctx.mlflow.log_dict(verdict, "verdict.json")
    ctx.mlflow.set_tags({"posttrain.gate": verdict["decision"]})
    for reason in verdict["reasons"]:
        ctx.progress(f"{verdict['decision'].upper()}: {reason}")
    return {"decision": verdict["decision"], "promote": verdict["promote"], "reasons": verdict["reasons"]}


def cli(argv: list[str], prog: str = "posttrain gate") -> int:
    from training.cli import stage_cli

    return stage_cli(argv, prog, "Decide promote/block from the evaluation report.", GateConfig, STAGE, body)
