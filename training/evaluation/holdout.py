"""The RL round's holdout check: greedy pass@1 per domain before and after a round (and the samples it shows).

Cheaper than the `evaluate` stage's measurements (training/evaluation/measure.py): one greedy answer per task,
judged by the task's verifier, the tasks' prompts rendered as in training; under torchrun each rank decodes its
share and the rows are gathered.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from training.modeling import distributed
from training.modeling.chat import PromptFormat
from training.rewards import verify_tasks
from training.tasksets.schema import Task


def holdout_pass_at_1(
    engine: Any, tasks: list[Task], max_new_tokens: int, fmt: PromptFormat | None = None
) -> tuple[dict[str, float], list[dict]]:
    """Greedy pass@1 per domain (and "all"), plus the rows (for a samples table). Prompts are rendered with
    `fmt` (the chat template) when given."""
    prompts = [fmt.prompt_ids(t) for t in tasks] if fmt is not None else [t.prompt for t in tasks]
    groups = engine.generate(prompts, n_samples=1, max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    texts = [g[0].text for g in groups]
    scores = [float(ok) for ok in verify_tasks(tasks, texts)]  # pass rates, not (weighted) rewards
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(tasks, scores):
        by_domain[t.domain].append(s)
    rates = {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rates["all"] = sum(scores) / max(1, len(scores))
    shown = [engine_text(engine, p) for p in prompts]
    rows = [
        {
            "id": t.id,
            "domain": t.domain,
            "difficulty": t.difficulty,
            "prompt": shown_prompt,
            "completion": c,
            "finish_reason": g[0].finish_reason,
            "reward": s,
        }
        for t, shown_prompt, g, c, s in zip(tasks, shown, groups, texts, scores)
    ]
    return rates, rows


def engine_text(engine: Any, prompt: Any) -> str:
    """A prompt as the model saw it (chat rendering and special tokens included), for sample tables."""
    if isinstance(prompt, str):
        return prompt
    return str(engine.tokenizer.decode(list(prompt), skip_special_tokens=False))


def holdout_subset(tasks: list[Task], per_domain: int) -> list[Task]:
    """The first `per_domain` tasks of each domain, in order (0 = all)."""
    if not per_domain:
        return tasks
    seen: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        if seen[t.domain] < per_domain:
            out.append(t)
            seen[t.domain] += 1
    return out


def holdout_check(
    engine: Any, tasks: list[Task], max_new_tokens: int, fmt: PromptFormat
) -> tuple[dict[str, float], list[dict]]:
    """holdout_pass_at_1 over all ranks: each greedily decodes its share, the rows are gathered in order and
    the rates computed from all of them (1 process: holdout_pass_at_1 itself)."""
    if distributed.world_size() == 1:
        return holdout_pass_at_1(engine, tasks, max_new_tokens, fmt)
    _, mine = holdout_pass_at_1(engine, distributed.shard(tasks), max_new_tokens, fmt)
    rows = distributed.gather(mine, len(tasks))
    by_domain: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_domain[row["domain"]].append(row["reward"])
    rates = {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rates["all"] = sum(r["reward"] for r in rows) / max(1, len(rows))
    return rates, rows


def task_outcomes(rows: list[dict]) -> dict[str, dict[str, bool]]:
    """{domain: {task id: passed}} from holdout rows, for paired comparisons of two measurements of the same
    tasks (the gate's paired test)."""
    out: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in rows:
        out[r["domain"]][str(r["id"])] = bool(r["reward"] > 0)
    return {d: out[d] for d in sorted(out)}


def holdout_samples(rows: list[dict], n: int) -> list[dict]:
    """About n holdout rows for the samples table, shared evenly over the domains."""
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(r)
    per = max(1, n // max(1, len(by_domain)))
    return [{"step": "holdout", **r} for d in sorted(by_domain) for r in by_domain[d][:per]]
