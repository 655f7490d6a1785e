"""Which prompts an RL step trains on: a domain mix, and inside a domain a curriculum over difficulties.

A group's reward variance p(1-p) is largest when the pass rate p is mid-band, so difficulties whose running pass
rate sits in the learnable band are drawn most (cf. DAPO dynamic sampling and "online difficulty filtering",
Bae et al. 2025). Everything is a pure function of its inputs and the caller's seeded `random.Random`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from training.tasksets.schema import Task


@dataclass
class Curriculum:
    """Running pass rate per (domain, difficulty); picks difficulties that sit in the learnable band."""

    band: tuple[float, float]
    floor: float
    ema: float
    rates: dict[str, float] = field(default_factory=dict)  # "math/3" -> pass rate

    def weight(self, domain: str, difficulty: int) -> float:
        rate = self.rates.get(f"{domain}/{difficulty}")
        if rate is None:
            return 1.0  # unknown: worth a look
        return 1.0 if self.band[0] <= rate <= self.band[1] else self.floor

    def update(self, domain: str, difficulty: int, pass_rate: float) -> None:
        key = f"{domain}/{difficulty}"
        old = self.rates.get(key)
        self.rates[key] = pass_rate if old is None else (1 - self.ema) * old + self.ema * pass_rate


def domain_counts(weights: dict[str, float], domains: list[str], n: int) -> dict[str, int]:
    """Split n prompts over domains by weight (largest remainder, deterministic)."""
    w = {d: float(weights.get(d, 0.0 if weights else 1.0)) for d in domains}
    total = sum(w.values())
    if total <= 0:
        raise ValueError(f"domain_weights {weights} give no weight to any train domain {domains}")
    exact = {d: n * v / total for d, v in w.items()}
    counts = {d: int(math.floor(x)) for d, x in exact.items()}
    for d in sorted(domains, key=lambda d: (-(exact[d] - counts[d]), d))[: n - sum(counts.values())]:
        counts[d] += 1
    return counts


def pick_prompts(
    pool: dict[str, dict[int, list[Task]]], counts: dict[str, int], curriculum: Curriculum | None, rng: random.Random
) -> list[Task]:
    """counts[d] tasks from domain d; the difficulty of each drawn with curriculum weights, the task uniformly."""
    chosen = []
    for domain in sorted(counts):
        levels = sorted(pool[domain])
        weights = [curriculum.weight(domain, lv) if curriculum else 1.0 for lv in levels]
        for _ in range(counts[domain]):
            level = rng.choices(levels, weights=weights)[0]
            chosen.append(rng.choice(pool[domain][level]))
    return chosen
