"""Train/holdout splits and domain mixing, deterministic by seed.

- `stratified_split`: within every (domain, difficulty) group, a seeded shuffle puts round(fraction * size)
  tasks in the holdout: at least one when the group has two or more tasks and fraction > 0, never the whole
  group. Holdout proportions per domain and difficulty therefore match the input's. But a task's side depends
  on every other task of its group, so it moves when the data changes.
- `hash_split`: a task is in the holdout when the hash of (salt, domain, normalised prompt) falls below the
  fraction: a pure function of the task's own content, so across rebuilds with new or removed rows a task once
  held out stays held out and a train task never enters the holdout (for a fixed salt and fraction), and
  near-duplicates (the same normalised prompt) land on the same side. Proportions match the fraction in
  expectation, not exactly.
- `mix_train`: brings the train set to the configured domain ratios by subsampling the over-represented
  domains (each subsample stratified by difficulty). Domains absent from the ratios are kept whole; a ratio of
  0 drops a domain from train. When every domain's share is already within `tolerance` of its target, nothing
  is dropped (a synthetic profile planned with the same ratios only loses a little to dedup).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from training.tasksets.dedup import normalize_text
from training.tasksets.schema import Task


def _groups(tasks: Sequence[Task]) -> dict[tuple[str, int], list[Task]]:
    groups: dict[tuple[str, int], list[Task]] = defaultdict(list)
    for task in tasks:
        groups[(task.domain, task.difficulty)].append(task)
    return dict(sorted(groups.items()))


def _shuffled(items: list[Task], seed: int, *key: Any) -> list[Task]:
    out = list(items)
    random.Random(":".join(str(k) for k in (seed, *key))).shuffle(out)
    return out


def stratified_split(tasks: Sequence[Task], holdout_fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, holdout), each in input order."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    held: set[str] = set()
    for (domain, level), group in _groups(tasks).items():
        k = round(holdout_fraction * len(group))
        if holdout_fraction > 0 and len(group) >= 2:
            k = min(max(k, 1), len(group) - 1)
        elif len(group) < 2:
            k = 0
        held.update(t.id for t in _shuffled(group, seed, "split", domain, level)[:k])
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def holdout_score(task: Task, salt: str) -> float:
    """Where a task falls in [0, 1): the first 8 bytes of sha256(salt, domain, normalised prompt)."""
    digest = hashlib.sha256("\x1f".join((salt, task.domain, normalize_text(task.prompt))).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_split(tasks: Sequence[Task], holdout_fraction: float, salt: str) -> tuple[list[Task], list[Task]]:
    """(train, holdout), each in input order: holdout where holdout_score(task, salt) < holdout_fraction."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    held = {t.id for t in tasks if holdout_score(t, salt) < holdout_fraction}
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def _stratified_take(tasks: list[Task], k: int, seed: int, domain: str) -> list[Task]:
    """k of `tasks` with difficulty proportions kept (systematic sampling over seeded per-level orders)."""
    ranked: list[tuple[float, str]] = []
    for level, group in _groups(tasks).items():
        for pos, task in enumerate(_shuffled(group, seed, "mix", *level)):
            ranked.append(((pos + 0.5) / len(group), task.id))
    keep = {tid for _, tid in sorted(ranked)[:k]}
    return [t for t in tasks if t.id in keep]


def mix_train(
    train: Sequence[Task], ratios: Mapping[str, float], seed: int, tolerance: float = 0.05
) -> tuple[list[Task], dict[str, Any]]:
    """The train set at the configured domain ratios, plus a report of what was kept."""
    available = Counter(t.domain for t in train)
    report: dict[str, Any] = {
        "ratios": dict(ratios),
        "available": dict(sorted(available.items())),
        "tolerance": tolerance,
    }
    if not ratios:
        report.update(kept=dict(report["available"]), dropped=0, subsampled=False)
        return list(train), report
    mixed = {d: float(r) for d, r in ratios.items() if d in available}
    total_r = sum(mixed.values())
    mixed_n = sum(available[d] for d in mixed)
    targets = {d: r / total_r for d, r in mixed.items()} if total_r > 0 else {}
    shares = {d: available[d] / mixed_n for d in mixed} if mixed_n else {}
    within = all(abs(shares[d] - targets.get(d, 0.0)) <= tolerance for d in mixed) and all(
        r > 0 for r in mixed.values()
    )
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in train:
        by_domain[task.domain].append(task)
    keep_n: dict[str, int] = {d: len(ts) for d, ts in by_domain.items()}
    if not within:
        positive = {d: p for d, p in targets.items() if p > 0}
        scale = min(available[d] / p for d, p in positive.items()) if positive else 0.0
        for d in mixed:
            keep_n[d] = min(available[d], math.floor(scale * targets.get(d, 0.0) + 1e-9))
    out: list[Task] = []
    kept_ids: set[str] = set()
    for d, ts in by_domain.items():
        take = ts if keep_n[d] >= len(ts) else _stratified_take(ts, keep_n[d], seed, d)
        kept_ids.update(t.id for t in take)
    out = [t for t in train if t.id in kept_ids]
    kept = Counter(t.domain for t in out)
    report.update(
        targets=targets,
        kept=dict(sorted(kept.items())),
        dropped=len(train) - len(out),
        subsampled=not within,
        unmixed_domains=sorted(set(available) - set(ratios)),
    )
    return out, report
