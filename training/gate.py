"""`posttrain gate` and `posttrain promote`: the verdict on the evaluated candidate, and acting on it.

gate:    reads `<run>/evaluate/report.json`, applies training/gates.py, writes `verdict.json`
         ({"promote": bool, "decision": "promote"|"block", "reasons": [...], "findings": [...]}). The stage
         succeeds either way: a block is a verdict, not a failure; the DAG branches on it.
promote: reads the verdict; on "promote" registers the candidate's folder URI as a new version of the MLflow
         registered model and moves the `champion` alias to it. On "block" it refuses (exit 2), naming the
         reasons, so a hand-run promote cannot bypass the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training import storage
from training.config import ConfigBase, load_config
from training.gates import Counts, GateConfig, decide
from training.registry import DEFAULT_MODEL_NAME
from training.stage import StageContext, run_stage


class GateBlocked(RuntimeError):
    pass


def _counts(model_report: dict[str, Any]) -> dict[str, Counts]:
    return {d: Counts(int(r["pass1"]["passed"]), int(r["pass1"]["total"]))
            for d, r in model_report["domains"].items()}


def _round_holdout(rnd: dict[str, Any]) -> dict[str, Counts] | None:
    holdout = rnd.get("holdout")
    if not holdout:
        return None
    return {d: Counts(int(c["passed"]), int(c["total"])) for d, c in holdout.items()}


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


def gate_body(ctx: StageContext) -> dict[str, Any]:
    cfg: GateConfig = ctx.config  # type: ignore[assignment]
    report = storage.read_json(ctx.input("evaluate"), "report.json")
    verdict = verdict_from_report(report, cfg)
    ctx.writer.put_json(verdict, "verdict.json")
    ctx.mlflow.log_dict(verdict, "verdict.json")
    ctx.mlflow.set_tags({"posttrain.gate": verdict["decision"]})
    for reason in verdict["reasons"]:
        ctx.progress(f"{verdict['decision'].upper()}: {reason}")
    return {"decision": verdict["decision"], "promote": verdict["promote"], "reasons": verdict["reasons"]}


@dataclass(frozen=True)
class PromoteConfig(ConfigBase):
    """Promotion.

    model_name: MLflow registered model to add a version to.
    alias:      the alias moved to the new version ("champion" is what evaluate compares against).
    """

    model_name: str = DEFAULT_MODEL_NAME
    alias: str = "champion"


def promote_body(ctx: StageContext) -> dict[str, Any]:
    from training.registry import promote

    cfg: PromoteConfig = ctx.config  # type: ignore[assignment]
    verdict = storage.read_json(ctx.input("gate"), "verdict.json")
    if not verdict["promote"]:
        raise GateBlocked("the gate blocked this candidate: " + "; ".join(verdict["reasons"]))
    candidate = storage.require_manifest(verdict["candidate_uri"], "candidate")
    ctx.add_parent(candidate)
    champ = promote(candidate.uri, cfg.model_name, run_id=candidate.mlflow_run_id,
                    tags={"posttrain.run_id": ctx.run_id, "posttrain.stage": verdict.get("candidate_stage", "")},
                    alias=cfg.alias)
    ctx.writer.put_json({"model_name": champ.name, "version": champ.version, "alias": cfg.alias,
                         "source": champ.source}, "promotion.json")
    ctx.progress(f"promoted {champ.source} as {champ.name} v{champ.version} (alias {cfg.alias})")
    return {"model_name": champ.name, "version": champ.version, "alias": cfg.alias, "source": champ.source}


def gate_cli(argv: list[str], prog: str) -> int:
    from training.cli import run_cli, stage_parser

    args = stage_parser(prog, "Decide promote/block from the evaluation report.", GateConfig).parse_args(argv)
    return run_cli(lambda: run_stage("gate", load_config(GateConfig, args.config, args.set), args.run,
                                     gate_body) and 0)


def promote_cli(argv: list[str], prog: str) -> int:
    import sys

    from training.cli import run_cli, stage_parser

    args = stage_parser(prog, "Register the gated candidate and move the champion alias.",
                        PromoteConfig).parse_args(argv)

    def go() -> int:
        try:
            run_stage("promote", load_config(PromoteConfig, args.config, args.set), args.run, promote_body)
        except GateBlocked as err:
            print(f"posttrain: error: {err}", file=sys.stderr)
            return 2
        return 0

    return run_cli(go)
