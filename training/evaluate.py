"""`posttrain evaluate`: the candidate, the SFT baseline and the champion on the same holdout, per domain.

What is measured for each model (all on the run's holdout split, per domain):
- pass@1 (greedy) and unbiased pass@k from `n_samples` samples (Chen et al. 2021);
- success by difficulty (the long tail: where the model stops being reliable);
- format-following rate: the completion has the shape the verifier needs (a number / valid JSON / code that
  parses), passing or not;
- self-repair for code: a failed program is shown with its sandbox error and the model retries, up to
  `repair_turns` times; success within R turns;
- long-context consistency: the same tasks with distractor text (other tasks) in front; pass@1 there and the
  share of greedy passes kept;
- failure modes: each greedy failure is "capability" (no sample passed: pass@k low) or "instability" (some
  sample passed: pass@k high, pass@1 low).

Outputs under `<run>/evaluate/`: report.json (machine-readable, read by the gate), report.md and report.html
(with plots: pass@1 per domain against the champion and the SFT baseline, reward per RL round), plots/*.png.
All of it is logged to the stage's MLflow run.
"""

from __future__ import annotations

import ast
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import storage
from training.config import ConfigBase, load_config
from training.metrics import mean_pass_at_k
from training.registry import DEFAULT_MODEL_NAME
from training.stage import StageContext, run_stage
from training.tasksets.schema import Task

MODEL_SUBDIR = "model"


@dataclass(frozen=True)
class EvalConfig(ConfigBase):
    """Holdout evaluation.

    candidate:          "latest" (the highest complete rl_round_N of this run, else sft), a stage name of this
                        run, or a model folder URI.
    baseline_stage:     the SFT stage of this run, the reference every RL round must beat.
    compare_champion:   also evaluate the MLflow registry's `champion` of `model_name` (skipped if none yet).
    max_tasks_per_domain: cap on holdout tasks per domain (keeps evaluation cheap on CPU).
    n_samples / ks:     samples per task at `temperature` for unbiased pass@k (Chen et al. 2021), k <= n.
    repair_turns:       self-repair rounds for failed code tasks (the model sees the sandbox error).
    long_context_tasks: tasks per domain re-asked behind distractor text; distractor_tokens is its length.
    """

    candidate: str = "latest"
    baseline_stage: str = "sft"
    compare_champion: bool = True
    model_name: str = DEFAULT_MODEL_NAME
    max_tasks_per_domain: int = 200
    max_new_tokens: int = 48
    n_samples: int = 8
    ks: list[int] = field(default_factory=lambda: [1, 4, 8])
    temperature: float = 0.8
    repair_turns: int = 1
    long_context_tasks: int = 40
    distractor_tokens: int = 48
    seed: int = 0
    batch_size: int = 256


# ----- format checks ------------------------------------------------------------------------------------------
def format_ok(task: Task, completion: str) -> bool:
    """Does the completion have the shape the task's verifier can judge (right or wrong)?"""
    if task.verifier == "math":
        from training.rewards.math import extract_answer, parse_number

        return parse_number(extract_answer(completion)) is not None
    if task.verifier == "json_rules":
        from training.rewards.rules import extract_json

        try:
            return isinstance(extract_json(completion), (dict, list))
        except (ValueError, TypeError):
            return False
    if task.verifier == "code":
        from training.rewards.code import assemble_program

        try:
            ast.parse(assemble_program(completion, task.metadata))
            return bool(completion.strip())
        except SyntaxError:
            return False
    return bool(completion.strip())


# ----- the measurements ---------------------------------------------------------------------------------------
def _by_domain(tasks: list[Task]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        out[t.domain].append(i)
    return dict(sorted(out.items()))


def _greedy(engine: Any, prompts: list[str], cfg: EvalConfig) -> list[str]:
    outs = engine.generate(prompts, 1, cfg.max_new_tokens, temperature=0.0, seed=cfg.seed)
    return [o[0].text for o in outs]


def _repair_prompt(task: Task, completion: str, error: str) -> str:
    error = " ".join(error.strip().splitlines()[-2:])[:160] or "wrong result"
    return f"{task.prompt}{completion}\n# error: {error}\n# fixed:\n"


def fit_prompt(tokenizer: Any, text: str, max_tokens: int | None) -> str:
    """Keep the end of `text` (where the question is) within `max_tokens` tokens."""
    if not max_tokens:
        return text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[-max_tokens:])


def self_repair(engine: Any, tasks: list[Task], completions: list[str], passed: list[bool],
                cfg: EvalConfig, tokenizer: Any = None, max_context: int | None = None) -> dict[int, int]:
    """{task index: turn it first passed at} for code tasks that failed greedily and were repaired."""
    from sandbox import run_batch
    from training.rewards.code import code_job

    current = {i: completions[i] for i, t in enumerate(tasks) if t.verifier == "code" and not passed[i]}
    repaired: dict[int, int] = {}
    for turn in range(1, cfg.repair_turns + 1):
        if not current:
            break
        idx = sorted(current)
        jobs = {i: code_job(current[i], tasks[i].tests, tasks[i].metadata, tasks[i].id) for i in idx}
        runnable = [i for i in idx if jobs[i] is not None]
        errors = {i: "no code to run" for i in idx}  # an empty completion (or no usable tests)
        errors.update({i: v.detail or v.stderr or v.status.value
                       for i, v in zip(runnable, run_batch([jobs[i] for i in runnable]))})
        budget = max_context - cfg.max_new_tokens if max_context else None
        prompts = [fit_prompt(tokenizer, _repair_prompt(tasks[i], current[i], errors[i]), budget) for i in idx]
        retry = [o[0].text for o in engine.generate(prompts, 1, cfg.max_new_tokens, temperature=0.0,
                                                     seed=cfg.seed + turn)]
        from training.rewards import score_tasks

        scores = score_tasks([tasks[i] for i in idx], retry)
        for i, text, score in zip(idx, retry, scores):
            if score > 0:
                repaired[i] = turn
                del current[i]
            else:
                current[i] = text
    return repaired


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def _distractor(tasks: list[Task], rng: random.Random, tokenizer: Any, budget: int) -> str:
    """Other tasks (prompt + reference) as filler, as many as fit in `budget` tokens."""
    parts, used = [], 0
    for _ in range(4 * max(budget, 1)):
        other = tasks[rng.randrange(len(tasks))]
        text = f"{other.prompt}{other.reference}\n"
        cost = _n_tokens(tokenizer, text)
        if used + cost > budget:
            if used:
                break
            continue
        parts.append(text)
        used += cost
    return "".join(parts)


def context_limit(model: Any) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def evaluate_model(engine: Any, tokenizer: Any, tasks: list[Task], cfg: EvalConfig,
                   max_context: int | None = None) -> dict[str, Any]:
    """Every measurement above for one model; counts are kept so the gate can compute intervals.

    max_context: the model's position limit; distractor text is cut so prompt + completion fit in it.
    """
    from training.rewards import score_tasks

    prompts = [t.prompt for t in tasks]
    greedy = _greedy(engine, prompts, cfg)
    passed = [s > 0 for s in score_tasks(tasks, greedy)]
    sampled = engine.generate(prompts, cfg.n_samples, cfg.max_new_tokens, temperature=cfg.temperature,
                              seed=cfg.seed)
    flat_tasks = [t for t in tasks for _ in range(cfg.n_samples)]
    flat = score_tasks(flat_tasks, [c.text for group in sampled for c in group])
    correct = [sum(1 for s in flat[i * cfg.n_samples:(i + 1) * cfg.n_samples] if s > 0) for i in range(len(tasks))]
    repaired = self_repair(engine, tasks, greedy, passed, cfg, tokenizer, max_context) if cfg.repair_turns > 0 else {}

    rng = random.Random(cfg.seed)
    domains = _by_domain(tasks)
    long_idx = [i for idx in domains.values() for i in idx[:cfg.long_context_tasks]]
    long_prompts = []
    for i in long_idx:
        budget = cfg.distractor_tokens
        if max_context:
            budget = min(budget, max_context - cfg.max_new_tokens - _n_tokens(tokenizer, tasks[i].prompt))
        long_prompts.append(_distractor(tasks, rng, tokenizer, budget) + tasks[i].prompt)
    long_out = [o[0].text for o in engine.generate(long_prompts, 1, cfg.max_new_tokens, temperature=0.0,
                                                    seed=cfg.seed)]
    long_pass = dict(zip(long_idx, (s > 0 for s in score_tasks([tasks[i] for i in long_idx], long_out))))

    report: dict[str, Any] = {}
    for domain, idx in domains.items():
        ks = [k for k in cfg.ks if k <= cfg.n_samples]
        by_diff: dict[str, dict[str, int]] = {}
        for i in idx:
            d = by_diff.setdefault(str(tasks[i].difficulty), {"passed": 0, "total": 0})
            d["total"] += 1
            d["passed"] += int(passed[i])
        failures = [i for i in idx if not passed[i]]
        code = tasks[idx[0]].verifier == "code"
        lc = [i for i in idx if i in long_pass]
        kept = [i for i in lc if passed[i]]
        report[domain] = {
            "pass1": {"passed": sum(passed[i] for i in idx), "total": len(idx)},
            "pass_at_k": {str(k): mean_pass_at_k([(cfg.n_samples, correct[i]) for i in idx], k) for k in ks},
            "by_difficulty": dict(sorted(by_diff.items())),
            "format_rate": sum(format_ok(tasks[i], greedy[i]) for i in idx) / len(idx),
            "failure_modes": {
                "capability": sum(1 for i in failures if correct[i] == 0),
                "instability": sum(1 for i in failures if correct[i] > 0),
            },
            "long_context": {
                "passed": sum(long_pass[i] for i in lc), "total": len(lc),
                "consistency": (sum(long_pass[i] for i in kept) / len(kept)) if kept else None,
            },
            **({"self_repair": {
                "failed_first": len(failures),
                "repaired_within": {str(r): sum(1 for t in repaired.values() if t <= r)
                                    for r in range(1, cfg.repair_turns + 1)},
                "pass_within_turns": (sum(passed[i] for i in idx) + len([i for i in idx if i in repaired]))
                / len(idx),
            }} if code else {}),
        }
    samples = [{"id": tasks[i].id, "domain": tasks[i].domain, "prompt": tasks[i].prompt,
                "completion": greedy[i], "passed": passed[i]} for idx in domains.values() for i in idx[:10]]
    return {"domains": report, "samples": samples}


def pass1_rate(model_report: dict[str, Any], domain: str) -> float:
    c = model_report["domains"][domain]["pass1"]
    return c["passed"] / c["total"] if c["total"] else 0.0


# ----- which models ----------------------------------------------------------------------------------------
def latest_policy_stage(rounds: list[dict[str, Any]], baseline: str = "sft") -> str:
    """The newest complete RL round (from `rounds_history`), else the baseline stage."""
    return rounds[-1]["stage"] if rounds else baseline


def rounds_history(run_uri: str) -> list[dict[str, Any]]:
    """Per complete RL round: its stage name and summary (train reward, holdout check) for plots and gate."""
    out, n = [], 1
    while (m := storage.read_manifest(storage.join(run_uri, f"rl_round_{n}"))) is not None:
        out.append({"stage": f"rl_round_{n}", **m.extra.get("summary", {})})
        n += 1
    return out


# ----- report rendering -------------------------------------------------------------------------------------------
def _plots(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    models = report["models"]
    domains = sorted(models["candidate"]["domains"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(models)
    colours = {"sft": "#9aa0a6", "champion": "#f4b400", "candidate": "#1a73e8"}
    for j, (name, rep) in enumerate(models.items()):
        xs = [i + (j - (len(models) - 1) / 2) * width for i in range(len(domains))]
        ax.bar(xs, [pass1_rate(rep, d) * 100 for d in domains], width, label=name, color=colours.get(name))
    ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("holdout pass@1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title("pass@1 per domain: candidate vs champion vs SFT baseline")
    ax.legend(loc="upper right")
    fig.tight_layout()
    paths["pass1_by_domain"] = out_dir / "pass1_by_domain.png"
    fig.savefig(paths["pass1_by_domain"], dpi=110)
    plt.close(fig)

    rounds = report.get("rounds", [])
    if rounds:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        xs = list(range(1, len(rounds) + 1))
        ax.plot(xs, [r.get("train_reward_mean", float("nan")) for r in rounds], "o-", label="train reward (mean)")
        for domain in domains:
            ys = []
            for r in rounds:
                h = (r.get("holdout") or {}).get(domain)
                ys.append(h["passed"] / h["total"] if h and h.get("total") else float("nan"))
            ax.plot(xs, ys, "s--", label=f"holdout pass@1 {domain}")
        ax.set_xticks(xs, [f"round {x}" for x in xs])
        ax.set_ylim(0, 1)
        ax.set_title("reward and holdout per RL round")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        paths["reward_per_round"] = out_dir / "reward_per_round.png"
        fig.savefig(paths["reward_per_round"], dpi=110)
        plt.close(fig)
    return paths


def render_markdown(report: dict[str, Any]) -> str:
    models = report["models"]
    domains = sorted(models["candidate"]["domains"])
    names = list(models)
    lines = [f"# Evaluation: {report['candidate_stage']} of run {report['run_id']}", "",
             "## Holdout pass@1 per domain", "",
             "| domain | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for d in domains:
        cells = []
        for n in names:
            c = models[n]["domains"].get(d, {}).get("pass1", {"passed": 0, "total": 0})
            cells.append(f"{c['passed']}/{c['total']} ({c['passed'] / max(c['total'], 1):.1%})")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    cand = models["candidate"]["domains"]
    lines += ["", "## Candidate in detail", "",
              "| domain | pass@k | format | capability / instability failures | long-context pass (consistency) |",
              "|---|---|---|---|---|"]
    for d in domains:
        r = cand[d]
        pk = ", ".join(f"@{k} {v:.2f}" for k, v in r["pass_at_k"].items())
        lc = r["long_context"]
        cons = "n/a" if lc["consistency"] is None else f"{lc['consistency']:.0%}"
        lines.append(f"| {d} | {pk} | {r['format_rate']:.0%} | {r['failure_modes']['capability']} / "
                     f"{r['failure_modes']['instability']} | {lc['passed']}/{lc['total']} ({cons}) |")
    for d in domains:
        if "self_repair" in cand[d]:
            sr = cand[d]["self_repair"]
            lines += ["", f"Self-repair ({d}): {sr['failed_first']} failed first; repaired within turns "
                          f"{sr['repaired_within']}; pass within turns {sr['pass_within_turns']:.1%}."]
    lines += ["", "## By difficulty (candidate, greedy)", ""]
    for d in domains:
        cells = ", ".join(f"L{k}: {v['passed']}/{v['total']}" for k, v in cand[d]["by_difficulty"].items())
        lines.append(f"- **{d}**: {cells}")
    lines += ["", "![pass@1 per domain](plots/pass1_by_domain.png)"]
    if report.get("rounds"):
        lines += ["", "![reward per round](plots/reward_per_round.png)"]
    return "\n".join(lines) + "\n"


def render_html(markdown: str, plots: dict[str, Path]) -> str:
    """A self-contained page: the markdown tables as HTML, plots inlined as base64 PNGs."""
    import base64
    import html

    body: list[str] = []
    table: list[str] = []

    def flush_table() -> None:
        if not table:
            return
        rows = [r.strip("|").split("|") for r in table if not set(r) <= set("|-")]
        head, *rest = rows
        body.append("<table><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>" for c in head) + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r) + "</tr>"
                              for r in rest) + "</table>")
        table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush_table()
        if line.startswith("!["):
            name = Path(line.split("(", 1)[1].rstrip(")")).stem
            if name in plots:
                data = base64.b64encode(plots[name].read_bytes()).decode()
                body.append(f'<img alt="{name}" src="data:image/png;base64,{data}">')
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("- "):
            body.append(f"<p>{html.escape(line[2:]).replace('**', '')}</p>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    flush_table()
    style = ("body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#202124}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #dadce0;padding:4px 10px}"
             "th{background:#f1f3f4}img{max-width:100%}")
    return f"<!doctype html><meta charset=utf-8><title>posttrain evaluation</title><style>{style}</style>" \
           + "\n".join(body)


# ----- the stage ----------------------------------------------------------------------------------------------
def _load(spec: str, cache: Path) -> tuple[Any, Any]:
    from training.models import load_model

    return load_model(spec, MODEL_SUBDIR, cache_dir=cache)


def body(ctx: StageContext) -> dict[str, Any]:
    from training.rollout.hf import HFRolloutEngine
    from training.tasksets.io import load_tasks

    cfg: EvalConfig = ctx.config  # type: ignore[assignment]
    taskset = ctx.input("taskset")
    holdout = load_tasks(storage.fetch(taskset, "holdout.parquet", ctx.workdir / "holdout.parquet"))
    rng = random.Random(cfg.seed)
    tasks = []
    for idx in _by_domain(holdout).values():
        chosen = sorted(rng.sample(idx, min(len(idx), cfg.max_tasks_per_domain)))
        tasks += [holdout[i] for i in chosen]
    ctx.progress(f"holdout: {len(tasks)} tasks in {len(_by_domain(tasks))} domains")

    rounds = rounds_history(ctx.run_uri)
    candidate_stage = latest_policy_stage(rounds, cfg.baseline_stage) if cfg.candidate == "latest" \
        else cfg.candidate
    specs: dict[str, str] = {}
    if "://" in candidate_stage:
        specs["candidate"] = candidate_stage
    else:
        specs["candidate"] = ctx.input(candidate_stage).uri
    specs["sft"] = ctx.input(cfg.baseline_stage).uri
    if cfg.compare_champion:
        from training.registry import champion

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
        model, tok = _load(specs[name], ctx.workdir / f"model-{name}")
        model.eval()
        engine = HFRolloutEngine(model, tok, batch_size=cfg.batch_size)
        models[name] = {"uri": specs[name], **evaluate_model(engine, tok, tasks, cfg, context_limit(model))}
        ctx.progress(f"evaluated {name}", **{f"{name}_pass1_{d}": pass1_rate(models[name], d)
                                              for d in models[name]["domains"]})

    report = {"run_id": ctx.run_id, "candidate_stage": candidate_stage, "config": cfg.to_dict(),
              "models": models, "rounds": rounds}
    plots = _plots(report, ctx.workdir / "plots")
    markdown = render_markdown(report)
    page = render_html(markdown, plots)
    ctx.writer.put_json(report, "report.json")
    ctx.writer.put_bytes(markdown.encode(), "report.md")
    ctx.writer.put_bytes(page.encode(), "report.html")
    for name, path in plots.items():
        ctx.writer.put_file(path, f"plots/{path.name}")
        ctx.mlflow.log_artifact(path, "plots")
    ctx.mlflow.log_text(markdown, "report.md")
    ctx.mlflow.log_text(page, "report.html")
    ctx.mlflow.log_dict(report, "report.json")
    ctx.mlflow.log_table(models["candidate"]["samples"], "samples.json")
    summary = {name: {d: round(pass1_rate(rep, d), 4) for d in rep["domains"]} for name, rep in models.items()}
    return {"candidate_stage": candidate_stage, "candidate_uri": specs["candidate"], "pass1": summary}


def cli(argv: list[str], prog: str) -> int:
    from training.cli import run_cli, stage_parser

    args = stage_parser(prog, "Evaluate the candidate, SFT baseline and champion on the holdout.",
                        EvalConfig).parse_args(argv)
    return run_cli(lambda: run_stage("evaluate", load_config(EvalConfig, args.config, args.set), args.run, body)
                   and 0)
