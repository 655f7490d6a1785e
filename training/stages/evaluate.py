"""Stage `evaluate` (`posttrain evaluate`): the candidate, the SFT baseline and the champion on the same
holdout, per domain.

What is measured for each model, per domain on the run's holdout split, is listed in
training/evaluation/measure.py: pass@1 and pass@k, success by difficulty, the format-following rate,
self-repair for code, long-context consistency and failure modes (capability vs instability).

Outputs under `<run>/evaluate/`: report.json (machine-readable, read by the gate), report.md and report.html
(with plots: pass@1 per domain against the champion and the SFT baseline, pass@1 along the long-context sweep,
reward per RL round), plots/*.png.
All of it is logged to the stage's MLflow run. The measurements live in training/evaluation/measure.py, the
choice of models in candidates.py, plots and rendering in plots.py and report.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from training import storage
from training.cli import stage_cli
from training.evaluation.candidates import latest_policy_stage, rounds_history
from training.evaluation.config import EvalConfig
from training.evaluation.field import field_report, load_field
from training.evaluation.lineage import record_cycle
from training.evaluation.measure import by_domain, evaluate_model, pass1_rate
from training.evaluation.plots import plot_report
from training.evaluation.report import render_html, render_markdown
from training.modeling import models
from training.modeling.chat import PromptFormat
from training.modeling.devices import resolve_device
from training.modeling.models import context_limit
from training.registry import champion
from training.rewards.code import use_remote_sandbox
from training.rollout import resolve_engine
from training.rollout.hf import HFRolloutEngine
from training.stage import StageContext

STAGE = "evaluate"
MODEL_SUBDIR = "model"


# ----- the stage ----------------------------------------------------------------------------------------------
def open_engine(spec: str, cache: Path, cfg: EvalConfig) -> tuple[Any, Any, PromptFormat, int | None]:
    """(engine, tokenizer, prompt format, context length) for the model folder at `spec`."""
    import torch

    device = resolve_device(cfg.device)
    if resolve_engine(cfg.rollout_engine, device) == "vllm":
        from transformers import AutoConfig, GenerationConfig

        from training.rollout.vllm import VLLMRolloutEngine  # inside: vllm, the optional `gpu` extra

        storage.fetch_dir(storage.require_manifest(spec, "model"), MODEL_SUBDIR, cache)
        tok = models.load_tokenizer(cache)
        try:
            generation = GenerationConfig.from_pretrained(str(cache))
        except OSError:  # a folder without generation_config.json
            generation = None
        fmt = PromptFormat(tok, getattr(tok, "chat_settings", None), generation)
        engine = VLLMRolloutEngine(
            str(cache),
            tok,
            stop_ids=fmt.stop_ids,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            max_model_len=cfg.vllm_max_model_len or None,
        )
        return engine, tok, fmt, cfg.vllm_max_model_len or context_limit(AutoConfig.from_pretrained(str(cache)))
    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    model, tok = models.load_model(spec, MODEL_SUBDIR, dtype=dtype, cache_dir=cache)
    model.to(device).eval()
    fmt = PromptFormat(tok, getattr(tok, "chat_settings", None), model.generation_config)
    return HFRolloutEngine(model, tok, batch_size=cfg.batch_size, stop_ids=fmt.stop_ids), tok, fmt, context_limit(model)


def body(ctx: StageContext) -> dict[str, Any]:
    cfg: EvalConfig = ctx.config  # type: ignore[assignment]
    use_remote_sandbox(cfg.sandbox_url)
    holdout = ctx.tasks("holdout")
    rng = random.Random(cfg.seed)
    tasks = []
    for idx in by_domain(holdout).values():
        chosen = sorted(rng.sample(idx, min(len(idx), cfg.max_tasks_per_domain)))
        tasks += [holdout[i] for i in chosen]
    # the feedback slice: its verifiable tasks are measured (and gated) as the domain "field"
    field_tasks, field_records = load_field(ctx.input("taskset"), ctx.workdir)
    if field_tasks:
        chosen = sorted(rng.sample(range(len(field_tasks)), min(len(field_tasks), cfg.max_tasks_per_domain)))
        tasks += [field_tasks[i] for i in chosen]
    ctx.progress(f"holdout: {len(tasks)} tasks in {len(by_domain(tasks))} domains")

    rounds = rounds_history(ctx.run_uri)
    candidate_stage = latest_policy_stage(rounds, cfg.baseline_stage) if cfg.candidate == "latest" else cfg.candidate
    specs: dict[str, str] = {}
    if "://" in candidate_stage:
        specs["candidate"] = candidate_stage
    else:
        specs["candidate"] = ctx.input(candidate_stage).uri
    specs["sft"] = ctx.input(cfg.baseline_stage).uri
    champ = None
    if cfg.compare_champion:
        champ = champion(cfg.model_name)
        if champ is not None:
            specs["champion"] = champ.source
            ctx.add_parent(storage.require_manifest(champ.source, "champion"))
            ctx.progress(f"champion: {cfg.model_name} v{champ.version} at {champ.source}")
        else:
            ctx.progress(f"no champion registered for {cfg.model_name} yet; comparing with the SFT baseline only")

    models: dict[str, Any] = {}
    for name in ("sft", "champion", "candidate"):
        if name not in specs:
            continue
        same = next((m for m in models.values() if m["uri"] == specs[name]), None)
        if same is not None:  # e.g. no RL round yet: the candidate is the SFT model itself
            models[name] = same
            continue
        engine, tok, fmt, context = open_engine(specs[name], ctx.workdir / f"model-{name}", cfg)
        models[name] = {"uri": specs[name], **evaluate_model(engine, tok, tasks, cfg, context, fmt)}
        del engine  # one model on the device at a time
        ctx.progress(
            f"evaluated {name}", **{f"{name}_pass1_{d}": pass1_rate(models[name], d) for d in models[name]["domains"]}
        )

    report: dict[str, Any] = {
        "run_id": ctx.run_id,
        "candidate_stage": candidate_stage,
        "config": cfg.to_dict(),
        "models": models,
        "rounds": rounds,
        **({"field": field_report(models, field_records)} if field_records else {}),
    }
    plots = plot_report(report, ctx.workdir / "plots")
    markdown = render_markdown(report)
    page = render_html(markdown, plots)
    ctx.writer.put_json(report, "report.json")
    ctx.writer.put_bytes(markdown.encode(), "report.md")
    ctx.writer.put_bytes(page.encode(), "report.html")
    for path in plots.values():
        ctx.writer.put_file(path, f"plots/{path.name}")
        ctx.mlflow.log_artifact(path, "plots")
    ctx.mlflow.log_text(markdown, "report.md")
    ctx.mlflow.log_text(page, "report.html")
    ctx.mlflow.log_dict(report, "report.json")
    ctx.mlflow.log_table(models["candidate"]["samples"], "samples.json")
    summary = {name: {d: round(pass1_rate(rep, d), 4) for d in rep["domains"]} for name, rep in models.items()}
    cycle = record_cycle(ctx, report, cfg.model_name, champ)
    ctx.progress(f"model line {cfg.model_name}: run {cycle['runs']} in MLflow's history")
    if field_records:
        prod = report["field"]["production"]
        if prod["failure_rate"] is not None:
            ctx.mlflow.log_metrics({"field.production_failure_rate": prod["failure_rate"]})
        for name, m in report["field"]["models"].items():
            wf = m["weighted_failure_rate"]
            ctx.mlflow.log_metrics(
                {
                    f"field.{name}.pass1": m["pass1"],
                    **({f"field.{name}.weighted_failure_rate": wf} if wf is not None else {}),
                }
            )
    return {"candidate_stage": candidate_stage, "candidate_uri": specs["candidate"], "pass1": summary}


def cli(argv: list[str], prog: str = "posttrain evaluate") -> int:
    return stage_cli(
        argv, prog, "Evaluate the candidate, SFT baseline and champion on the holdout.", EvalConfig, STAGE, body
    )
