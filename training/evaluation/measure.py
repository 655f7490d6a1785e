"""What evaluation measures for one model on a holdout, per domain (the numbers in report.json).

- pass@1 (greedy) and unbiased pass@k from `n_samples` samples (Chen et al. 2021);
- success by difficulty (the long tail: where the model stops being reliable);
- pass@1 twice: lenient (the answer wherever the completion states it) and strict (only in the format the
  task requires, e.g. the last \\boxed{}); format-following rate: the completion has the shape the verifier needs
  (an answer in the required place / valid JSON / code that parses), passing or not;
- self-repair through the same environments as RL (`environments`; code: its visible tests run in the sandbox
  and their failure shown as the next user turn), greedy episodes of up to 1 + `repair_turns` answers: the
  first-attempt pass@1 and the pass within 1..R+1 turns, judged by the hidden tests;
- long context as a sweep: the same tasks with distractor text (other tasks) in front, its length at several
  fractions of the model's context window (`long_context_fractions`); pass@1 per fraction (a curve, plotted),
  and over the whole sweep pass@1 and the share of greedy passes kept (consistency);
- failure modes: each greedy failure is "capability" (no sample passed: pass@k low) or "instability" (some
  sample passed: pass@k high, pass@1 low), per domain and per difficulty with the pass@k curve of each level;
- long-tail stability: each task's success rate over its samples; their distribution per domain x difficulty
  cell, and the worst decile of tasks named (ids and the cells they fall in).

Every function takes a rollout engine, so the same code measures through transformers or vLLM, and every
prompt is rendered through the model's chat template (training.modeling.chat.PromptFormat) as in training. A prompt that
does not fit the model's context with its completion budget is dropped and counted, never cut.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from training.environments import environment_for, environment_name
from training.environments.episodes import run_episodes
from training.evaluation.config import EvalConfig
from training.evaluation.metrics import mean_pass_at_k
from training.modeling.chat import PromptFormat
from training.rewards import get_verifier, verify_tasks
from training.tasksets.distractors import distractor_text
from training.tasksets.schema import Task


def format_ok(task: Task, completion: str) -> bool:
    """Does the completion have the shape the task's verifier can judge (right or wrong)?"""
    return get_verifier(task.verifier).format_ok(task, completion)


# ----- the measurements ---------------------------------------------------------------------------------------
def by_domain(tasks: list[Task]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        out[t.domain].append(i)
    return dict(sorted(out.items()))


def _greedy(engine: Any, prompts: list[list[int]], cfg: EvalConfig) -> list[str]:
    outs = engine.generate(prompts, 1, cfg.max_new_tokens, temperature=0.0, seed=cfg.seed)
    return [o[0].text for o in outs]


def self_repair(
    engine: Any, tasks: list[Task], cfg: EvalConfig, fmt: PromptFormat, max_context: int | None = None
) -> tuple[dict[int, list[bool]], dict[int, int]]:
    """Greedy repair episodes through the same environments as RL (training/environments; code: the visible
    tests run in the sandbox, their failure shown as the next user turn), up to 1 + `repair_turns` answers, for
    the tasks that have one (`environment_name`: the config's for their domain, else their verifier's).
    Returns ({task index: [hidden tests pass within 1, 2, ..., 1 + repair_turns turns]}, {task index: 1 where
    the episode ended for lack of context}). Within k turns means the answer the episode ended with by turn k
    (it ends once the visible tests pass), judged by the task's own verifier (the hidden tests), so turn 1 is
    the greedy first attempt."""
    idx = [i for i, t in enumerate(tasks) if environment_name(t, cfg.environments)]
    if not idx:
        return {}, {}
    turns = 1 + cfg.repair_turns
    groups = run_episodes(
        engine,
        fmt,
        [tasks[i] for i in idx],
        lambda t: environment_for(t, cfg.environments),
        1,
        turns,
        cfg.max_new_tokens,
        temperature=0.0,
        seed=cfg.seed,
        max_context=max_context,
    )
    episodes = [g[0] for g in groups]
    flat = [(k, j) for k, ep in enumerate(episodes) for j in range(ep.turns)]
    ok = verify_tasks([episodes[k].task for k, _ in flat], [episodes[k].answers[j] for k, j in flat])
    passed = {(k, j): o for (k, j), o in zip(flat, ok)}
    within = {
        i: [passed[(k, min(t, ep.turns) - 1)] for t in range(1, turns + 1)]
        for k, (i, ep) in enumerate(zip(idx, episodes))
    }
    cut = {i: int(ep.ended_by == "context") for i, ep in zip(idx, episodes)}
    return within, cut


def failure_modes(passed: list[bool], correct: list[int], n_samples: int, ks: list[int]) -> dict[str, Any]:
    """Greedy failures split into "capability" (no sample passed) and "instability" (some did), and the mean
    pass@k curve, over one group of tasks (a domain, or one difficulty of it)."""
    failures = [i for i, ok in enumerate(passed) if not ok]
    return {
        "capability": sum(1 for i in failures if correct[i] == 0),
        "instability": sum(1 for i in failures if correct[i] > 0),
        "total": len(passed),
        "pass_at_k": {str(k): mean_pass_at_k([(n_samples, c) for c in correct], k) for k in ks if k <= n_samples},
    }


def long_tail(rows: list[tuple[str, str, int, int, int]], decile: float = 0.1) -> dict[str, Any]:
    """The success distribution and its worst tail, from (task id, domain, difficulty, samples passed, samples).

    cells: per "domain/L<difficulty>", the mean per-task success rate, its minimum and the share of tasks that
    never succeeded. worst_decile: the ceil(decile * n) tasks with the lowest success rate (ties broken by id,
    so the choice is reproducible), their ids, the rate at its top (threshold) and how many fall in each cell."""
    import math

    cells: dict[str, list[float]] = defaultdict(list)
    rated = []
    for task_id, domain, difficulty, c, n in rows:
        rate = c / n if n else 0.0
        cells[f"{domain}/L{difficulty}"].append(rate)
        rated.append((rate, task_id, f"{domain}/L{difficulty}"))
    rated.sort()
    worst = rated[: math.ceil(decile * len(rated))] if rated else []
    in_cells: dict[str, int] = defaultdict(int)
    for _, _, cell in worst:
        in_cells[cell] += 1
    return {
        "cells": {
            cell: {
                "tasks": len(r),
                "mean": sum(r) / len(r),
                "min": min(r),
                "never": sum(1 for x in r if x == 0) / len(r),
            }
            for cell, r in sorted(cells.items())
        },
        "worst_decile": {
            "tasks": [t for _, t, _ in worst],
            "threshold": worst[-1][0] if worst else None,
            "cells": dict(sorted(in_cells.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
    }


def evaluate_model(
    engine: Any,
    tokenizer: Any,
    tasks: list[Task],
    cfg: EvalConfig,
    max_context: int | None = None,
    fmt: PromptFormat | None = None,
) -> dict[str, Any]:
    """Every measurement above for one model; counts are kept so the gate can compute intervals.

    max_context: the model's position limit; a task whose prompt does not fit with `max_new_tokens` is dropped
    (counted in "dropped_over_length"), and distractor text is sized so prompt + completion fit.
    fmt: how prompts are rendered (default: the tokenizer's chat template and its saved chat settings).
    """
    fmt = fmt or PromptFormat(
        tokenizer,
        getattr(tokenizer, "chat_settings", None),
        getattr(getattr(engine, "model", None), "generation_config", None),
    )
    max_prompt = max_context - cfg.max_new_tokens if max_context else None
    all_prompts = [fmt.prompt_ids(t) for t in tasks]
    fits = [max_prompt is None or len(p) <= max_prompt for p in all_prompts]
    dropped = {d: sum(1 for i in idx if not fits[i]) for d, idx in by_domain(tasks).items()}
    tasks = [t for t, ok in zip(tasks, fits) if ok]
    prompts = [p for p, ok in zip(all_prompts, fits) if ok]
    greedy = _greedy(engine, prompts, cfg)
    passed = verify_tasks(tasks, greedy)  # lenient: the answer wherever the completion states it
    passed_strict = verify_tasks(tasks, greedy, strict=True)  # only in the format the task requires
    sampled = engine.generate(prompts, cfg.n_samples, cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
    flat_tasks = [t for t in tasks for _ in range(cfg.n_samples)]
    flat = verify_tasks(flat_tasks, [c.text for group in sampled for c in group])
    correct = [sum(flat[i * cfg.n_samples : (i + 1) * cfg.n_samples]) for i in range(len(tasks))]
    within, repair_cut = self_repair(engine, tasks, cfg, fmt, max_context) if cfg.repair_turns > 0 else ({}, {})

    rng = random.Random(cfg.seed)
    domains = by_domain(tasks)
    long_idx = [i for idx in domains.values() for i in idx[: cfg.long_context_tasks]]
    # The sweep: distractors at each fraction of the context window (without a known window, one point at
    # distractor_tokens), always cut to what fits with the prompt and the completion budget.
    points: list[tuple[float | None, int]] = (
        [(f, int(f * max_context)) for f in cfg.long_context_fractions]
        if max_context and cfg.long_context_fractions
        else [(None, cfg.distractor_tokens)]
    )
    sweep: list[dict[int, bool]] = []
    for _, target in points:
        long_prompts = []
        for i in long_idx:
            budget = target if max_prompt is None else min(target, max_prompt - len(prompts[i]))
            long_prompts.append(fmt.prompt_ids(tasks[i], prefix=distractor_text(tasks, rng, tokenizer, budget)))
        long_out = (
            [o[0].text for o in engine.generate(long_prompts, 1, cfg.max_new_tokens, temperature=0.0, seed=cfg.seed)]
            if long_prompts
            else []
        )
        sweep.append(dict(zip(long_idx, verify_tasks([tasks[i] for i in long_idx], long_out))))

    report: dict[str, Any] = {}
    for domain, idx in domains.items():
        ks = [k for k in cfg.ks if k <= cfg.n_samples]
        by_diff: dict[str, dict[str, int]] = {}
        for i in idx:
            d = by_diff.setdefault(str(tasks[i].difficulty), {"passed": 0, "total": 0})
            d["total"] += 1
            d["passed"] += int(passed[i])
        failures = [i for i in idx if not passed[i]]
        lc = [i for i in idx if i in sweep[0]]
        kept = [i for i in lc if passed[i]]
        levels: dict[int, list[int]] = defaultdict(list)
        for i in idx:
            levels[tasks[i].difficulty].append(i)
        group = {
            str(tasks[i].metadata.get("group"))
            for i in idx
            if isinstance(tasks[i].metadata, dict) and tasks[i].metadata.get("group")
        }
        formatted = [format_ok(tasks[i], greedy[i]) for i in idx]
        report[domain] = {
            "pass1": {"passed": sum(passed[i] for i in idx), "total": len(idx)},
            # per task, in one order, so the gate can pair this model with another on the same task ids
            "outcomes": {
                "ids": [tasks[i].id for i in idx],
                "pass1": [int(passed[i]) for i in idx],
                "pass1_strict": [int(passed_strict[i]) for i in idx],
                "format": [int(ok) for ok in formatted],
            },
            **({"group": group.pop()} if len(group) == 1 else {}),
            "dropped_over_length": dropped.get(domain, 0),
            # format rising while accuracy falls is the classic early-RL failure: both, side by side
            "pass1_strict": {"passed": sum(passed_strict[i] for i in idx), "total": len(idx)},
            "pass_at_k": {str(k): mean_pass_at_k([(cfg.n_samples, correct[i]) for i in idx], k) for k in ks},
            "by_difficulty": dict(sorted(by_diff.items())),
            "format_rate": sum(formatted) / len(idx),
            "format": {"passed": sum(formatted), "total": len(idx)},
            "failure_modes": {
                "capability": sum(1 for i in failures if correct[i] == 0),
                "instability": sum(1 for i in failures if correct[i] > 0),
            },
            "failure_modes_by_difficulty": {
                str(level): failure_modes(
                    [passed[i] for i in members], [correct[i] for i in members], cfg.n_samples, ks
                )
                for level, members in sorted(levels.items())
            },
            # over the whole sweep: pass@1 behind distractors, and the share of greedy passes kept there
            "long_context": {
                "passed": sum(point[i] for point in sweep for i in lc),
                "total": len(lc) * len(sweep),
                "consistency": (sum(point[i] for point in sweep for i in kept) / (len(kept) * len(sweep)))
                if kept
                else None,
            },
            "long_context_sweep": [
                {
                    "fraction": fraction,
                    "distractor_tokens": target,
                    "passed": sum(point[i] for i in lc),
                    "total": len(lc),
                }
                for (fraction, target), point in zip(points, sweep)
            ],
            **(
                {
                    "self_repair": repair_report(
                        [within[i] for i in idx if i in within], sum(repair_cut.get(i, 0) for i in idx)
                    )
                }
                if any(i in within for i in idx)
                else {}
            ),
        }
    tail = long_tail(
        [(tasks[i].id, tasks[i].domain, tasks[i].difficulty, correct[i], cfg.n_samples) for i in range(len(tasks))]
    )
    samples = [
        {
            "id": tasks[i].id,
            "domain": tasks[i].domain,
            "prompt": tokenizer.decode(prompts[i], skip_special_tokens=False),
            "completion": greedy[i],
            "passed": passed[i],
        }
        for idx in domains.values()
        for i in idx[:10]
    ]
    return {"domains": report, "long_tail": tail, "samples": samples}


def repair_report(within: list[list[bool]], cut: int) -> dict[str, Any]:
    """One domain's self-repair figures from each task's [pass within 1, 2, ..., R+1 turns] (hidden tests).

    first_attempt: pass@1 of the first answer; pass_within: {"k": {passed, total}} for k = 1..R+1 turns;
    failed_first and repaired_within ({"r": tasks that failed first and passed within r repair turns}) and
    pass_within_turns (the rate within all R+1 turns) as before, which the gate's self_repair rule reads."""
    total, turns = len(within), len(within[0])
    first = sum(w[0] for w in within)
    counts = {str(k): {"passed": sum(w[k - 1] for w in within), "total": total} for k in range(1, turns + 1)}
    return {
        "first_attempt": {"passed": first, "total": total},
        "pass_within": counts,
        "failed_first": total - first,
        "repaired_within": {str(r): counts[str(r + 1)]["passed"] - first for r in range(1, turns)},
        "pass_within_turns": counts[str(turns)]["passed"] / total,
        "repair_prompts_dropped_over_length": cut,
    }


def pass1_rate(model_report: dict[str, Any], domain: str) -> float:
    c = model_report["domains"][domain]["pass1"]
    return c["passed"] / c["total"] if c["total"] else 0.0
