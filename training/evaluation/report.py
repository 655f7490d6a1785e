"""The evaluation report for people: Markdown (report.md), and the same as a self-contained HTML page
(report.html) with the plots inlined. The HTML is rendered from the Markdown by markdown-it-py (CommonMark plus
tables), so the two can never say different things."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from training.evaluation.field import field_lines


def render_markdown(report: dict[str, Any]) -> str:
    models = report["models"]
    domains = sorted(models["candidate"]["domains"])
    names = list(models)
    lines = [
        f"# Evaluation: {report['candidate_stage']} of run {report['run_id']}",
        "",
        "## Holdout pass@1 per domain",
        "",
        "| domain | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for d in domains:
        cells = []
        for n in names:
            c = models[n]["domains"].get(d, {}).get("pass1", {"passed": 0, "total": 0})
            cells.append(f"{c['passed']}/{c['total']} ({c['passed'] / max(c['total'], 1):.1%})")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    cand = models["candidate"]["domains"]
    lines += [
        "",
        "## Candidate in detail",
        "",
        "| domain | pass@1 strict / lenient | pass@k | format | capability / instability failures "
        "| long-context pass (consistency) |",
        "|---|---|---|---|---|---|",
    ]
    for d in domains:
        r = cand[d]
        pk = ", ".join(f"@{k} {v:.2f}" for k, v in r["pass_at_k"].items())
        lc = r["long_context"]
        cons = "n/a" if lc["consistency"] is None else f"{lc['consistency']:.0%}"
        strict, lenient = r.get("pass1_strict", r["pass1"]), r["pass1"]
        both = f"{strict['passed']}/{strict['total']} / {lenient['passed']}/{lenient['total']}"
        lines.append(
            f"| {d} | {both} | {pk} | {r['format_rate']:.0%} | {r['failure_modes']['capability']} / "
            f"{r['failure_modes']['instability']} | {lc['passed']}/{lc['total']} ({cons}) |"
        )
    for d in domains:
        if "self_repair" in cand[d]:
            sr = cand[d]["self_repair"]
            within = "; ".join(
                f"within {k} turn{'s' if k != '1' else ''} {c['passed']}/{c['total']}"
                for k, c in sr.get("pass_within", {}).items()
            )
            lines += [
                "",
                f"Self-repair ({d}): {sr['failed_first']} failed first; repaired within turns "
                f"{sr['repaired_within']}; pass within turns {sr['pass_within_turns']:.1%}"
                + (f" ({within})." if within else "."),
            ]
    lines += ["", "## By difficulty (candidate, greedy)", ""]
    for d in domains:
        levels = ", ".join(f"L{k}: {v['passed']}/{v['total']}" for k, v in cand[d]["by_difficulty"].items())
        lines.append(f"- **{d}**: {levels}")
    lines += _sweep_lines(models, domains) + _failure_lines(cand, domains) + _tail_lines(models["candidate"])
    if report.get("field"):
        lines += field_lines(report["field"])
    lines += ["", "![pass@1 per domain](plots/pass1_by_domain.png)"]
    if any(len(cand[d].get("long_context_sweep", [])) > 1 for d in domains):
        lines += ["", "![long-context sweep](plots/long_context_sweep.png)"]
    if report.get("rounds"):
        lines += ["", "![reward per round](plots/reward_per_round.png)"]
    return "\n".join(lines) + "\n"


def _sweep_lines(models: dict[str, Any], domains: list[str]) -> list[str]:
    """pass@1 behind distractors at each point of the sweep, per model and domain."""
    points = models["candidate"]["domains"][domains[0]].get("long_context_sweep", []) if domains else []
    if not points:
        return []
    heads = [
        f"{p['fraction']:.0%} of context" if p["fraction"] is not None else f"{p['distractor_tokens']} tokens"
        for p in points
    ]
    lines = [
        "",
        "## Long context: pass@1 by distractor length",
        "",
        "| model | domain | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 2) + "|",
    ]
    for name, rep in models.items():
        for d in domains:
            sweep = rep["domains"].get(d, {}).get("long_context_sweep", [])
            cells = [f"{p['passed']}/{p['total']} ({p['passed'] / max(p['total'], 1):.0%})" for p in sweep]
            lines.append(f"| {name} | {d} | " + " | ".join(cells) + " |")
    return lines


def _failure_lines(cand: dict[str, Any], domains: list[str]) -> list[str]:
    lines = [
        "",
        "## Failure modes by difficulty (candidate)",
        "",
        "Capability: no sample passed; instability: the greedy answer failed but some sample passed.",
        "",
        "| domain | level | capability / instability / tasks | pass@k |",
        "|---|---|---|---|",
    ]
    for d in domains:
        for level, fm in cand[d].get("failure_modes_by_difficulty", {}).items():
            pk = ", ".join(f"@{k} {v:.2f}" for k, v in fm["pass_at_k"].items())
            lines.append(f"| {d} | L{level} | {fm['capability']} / {fm['instability']} / {fm['total']} | {pk} |")
    return lines


def _tail_lines(model: dict[str, Any]) -> list[str]:
    tail = model.get("long_tail")
    if not tail:
        return []
    worst = tail["worst_decile"]
    threshold = "n/a" if worst["threshold"] is None else f"{worst['threshold']:.0%}"
    named = ", ".join(f"{cell} ({n})" for cell, n in worst["cells"].items())
    lines = [
        "",
        "## Long tail (candidate, success rate over samples per task)",
        "",
        f"Worst decile: {len(worst['tasks'])} tasks at or below {threshold} success, in {named or 'none'}: "
        + ", ".join(worst["tasks"][:20])
        + (" ..." if len(worst["tasks"]) > 20 else "")
        + ".",
        "",
        "| cell | tasks | mean | min | never solved |",
        "|---|---|---|---|---|",
    ]
    for cell, c in tail["cells"].items():
        lines.append(f"| {cell} | {c['tasks']} | {c['mean']:.0%} | {c['min']:.0%} | {c['never']:.0%} |")
    return lines


STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#202124}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #dadce0;padding:4px 10px}"
    "th{background:#f1f3f4}img{max-width:100%}"
)


def render_html(markdown: str, plots: dict[str, Path]) -> str:
    """A self-contained page: the Markdown rendered, each `plots/<name>.png` image inlined as base64."""
    from markdown_it import MarkdownIt

    inlined = {
        f"plots/{path.name}": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
        for path in plots.values()
    }
    renderer = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = renderer.parse(markdown)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image" and child.attrGet("src") in inlined:
                child.attrSet("src", inlined[str(child.attrGet("src"))])
    body = renderer.renderer.render(tokens, renderer.options, {})
    return f"<!doctype html><meta charset=utf-8><title>posttrain evaluation</title><style>{STYLE}</style>\n{body}"
