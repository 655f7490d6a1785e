"""Stage `gate` (`posttrain gate`): the verdict on the evaluated candidate.

Reads `<run>/evaluate/report.json`, applies the rules in training/evaluation/gate_rules.py and writes
`verdict.json` ({"promote": bool, "decision": "promote"|"block", "reasons": [...], "findings": [...] (the
blocking ones), "checks": [...] (every rule's decision on every domain and dimension, with its numbers)}) and
`verdict.md`, the same as a table for people. The stage succeeds either way: a block is a verdict, not a
failure; the DAG branches on it, and `promote` refuses a blocked candidate.
"""

from __future__ import annotations

from typing import Any

from training import storage
from training.cli import stage_cli
from training.evaluation.gate_rules import Counts, GateConfig, decide
from training.stage import StageContext

STAGE = "gate"


def metric_counts(model_report: dict[str, Any], metric: str) -> dict[str, Counts]:
    """Counts per domain of one dimension of an evaluated model (domains without it are left out)."""
    out = {}
    for d, r in model_report["domains"].items():
        total = int(r["pass1"]["total"])
        kept = r.get("outcomes", {})
        if metric in ("pass1", "pass1_strict", "format") and metric in r:
            outcomes = dict(zip(kept["ids"], map(bool, kept[metric]))) if metric in kept else None
            out[d] = Counts(int(r[metric]["passed"]), int(r[metric]["total"]), outcomes)
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


def pairing(candidate: dict[str, Counts], reference: dict[str, Counts]) -> dict[str, int]:
    """How many of the candidate's holdout tasks the reference answered too (by task id, all domains)."""
    cand = {t for c in candidate.values() for t in (c.outcomes or {})}
    ref = {t for c in reference.values() for t in (c.outcomes or {})}
    return {"candidate": len(cand), "reference": len(ref), "shared": len(cand & ref)}


def render_verdict_markdown(verdict: dict[str, Any]) -> str:
    """verdict.md: the decision, then every rule's decision with its numbers."""
    lines = [f"# Gate: {verdict['decision'].upper()} ({verdict.get('candidate_stage')})", ""]
    lines += [f"- {r}" for r in verdict["reasons"]]
    paired = verdict.get("paired", {})
    if paired:
        lines += [""] + [
            f"Paired with {name}: {p['shared']} of the candidate's {p['candidate']} holdout tasks answered by both "
            f"({p['reference']} evaluated for {name})."
            for name, p in sorted(paired.items())
        ]
    family = verdict.get("family", {})
    if family:
        lines += [
            "",
            f"Regression family: {family['size']} tests (reference x domain or group x dimension), "
            f"{family['method']}-adjusted together at alpha {family['alpha']:.2f}.",
        ]
    lines += [
        "",
        "| rule | reference | domain | dimension | decision | p | adjusted p | numbers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in verdict.get("checks", []):
        nums = ", ".join(f"{k} {v:.4g}" for k, v in c["numbers"].items() if k not in ("p", "p_adjusted"))
        p = c["numbers"].get("p")
        p_adj = c["numbers"].get("p_adjusted")
        lines.append(
            f"| {c['rule']} | {c['reference']} | {c['domain']} | {c['metric']} | **{c['decision']}** "
            f"| {'' if p is None else f'{p:.3g}'} | {'' if p_adj is None else f'{p_adj:.3g}'} | {nums} |"
        )
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
    groups = {d: str(r["group"]) for d, r in models["candidate"]["domains"].items() if r.get("group")}
    verdict = decide(candidate, references, train_reward, holdout_first, cfg, dimensions, rounds, groups).to_dict()
    verdict["paired"] = {name: pairing(candidate, ref) for name, ref in references.items()}
    family = [c for c in verdict["checks"] if "family" in c["numbers"]]
    if family:
        verdict["family"] = {
            "size": len(family),
            "method": cfg.multiple_testing,
            "alpha": round(1 - cfg.confidence, 6),
        }
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
    return stage_cli(argv, prog, "Decide promote/block from the evaluation report.", GateConfig, STAGE, body)
