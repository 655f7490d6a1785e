"""Evaluation metrics as pure functions over counts."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), computed as a stable product."""
    if not 0 <= c <= n:
        raise ValueError(f"c={c} outside [0, n={n}]")
    if k < 1 or k > n:
        raise ValueError(f"k={k} must be in [1, n={n}]")
    if n - c < k:
        return 1.0
    # C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(samples: list[tuple[int, int]], k: int) -> float:
    """Mean pass@k over tasks, each given as (n samples, c passed)."""
    if not samples:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in samples) / len(samples)
