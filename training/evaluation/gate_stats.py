"""The gate's statistics: binomial intervals, the non-inferiority test and multiple-testing corrections.

Pure functions over counts (no model, no I/O, no gate settings); training/evaluation/gate_rules.py applies them
to the evaluation report. Each cites the method it implements; tests/training/evaluation/test_gates.py checks
them against hand-computed values.
"""

from __future__ import annotations

import math

_Z = {0.80: 1.2816, 0.90: 1.6449, 0.95: 1.9600, 0.99: 2.5758}


def z_value(confidence: float) -> float:
    if confidence not in _Z:
        raise ValueError(f"confidence {confidence} not supported; use one of {sorted(_Z)}")
    return _Z[confidence]


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927). n = 0 gives (0, 1)."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside [0, n={n}]")
    z = z_value(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def diff_interval(s1: int, n1: int, s2: int, n2: int, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (Newcombe 1998, method 10), from two Wilson intervals."""
    p1, p2 = (s1 / n1 if n1 else 0.0), (s2 / n2 if n2 else 0.0)
    l1, u1 = wilson_interval(s1, n1, confidence)
    l2, u2 = wilson_interval(s2, n2, confidence)
    d = p1 - p2
    lower = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    upper = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return lower, upper


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def noninferiority_p(s_cand: int, n_cand: int, s_ref: int, n_ref: int, margin: float) -> float:
    """One-sided p-value of H0 "p_cand - p_ref <= -margin" (the candidate is worse by the margin or more).

    Agresti-Caffo adjusted Wald test (Agresti & Caffo 2000): each proportion as (s + 1) / (n + 2) and its
    variance p(1-p)/(n + 2). A small p-value is evidence that the candidate is at most `margin` worse."""
    if n_cand <= 0 or n_ref <= 0:
        return 1.0
    pc, pr = (s_cand + 1) / (n_cand + 2), (s_ref + 1) / (n_ref + 2)
    se = math.sqrt(pc * (1 - pc) / (n_cand + 2) + pr * (1 - pr) / (n_ref + 2))
    return normal_sf((pc - pr + margin) / se)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm (1979) step-down adjusted p-values: sorted ascending, the i-th (from 0) of m is multiplied by
    (m - i), capped at 1, and made non-decreasing. Rejecting where adjusted < alpha controls the family-wise
    error rate at alpha across the family (here: the domains)."""
    order = sorted(p_values, key=lambda k: (p_values[k], k))
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[key]))
        out[key] = running
    return out
