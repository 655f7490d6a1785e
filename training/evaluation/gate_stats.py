"""The gate's statistics: binomial intervals, paired and unpaired tests, multiple-testing corrections.

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


def inferiority_p(s_cand: int, n_cand: int, s_ref: int, n_ref: int) -> float:
    """One-sided p-value of H0 "p_cand >= p_ref" against "the candidate is worse", for two independent samples
    (the Agresti-Caffo adjusted Wald test, as in noninferiority_p with a zero margin, the other tail)."""
    if n_cand <= 0 or n_ref <= 0:
        return 1.0
    pc, pr = (s_cand + 1) / (n_cand + 2), (s_ref + 1) / (n_ref + 2)
    se = math.sqrt(pc * (1 - pc) / (n_cand + 2) + pr * (1 - pr) / (n_ref + 2))
    return normal_sf((pr - pc) / se)


def mcnemar_p(worse: int, better: int, mid: bool = True) -> float:
    """One-sided McNemar test on the discordant pairs: `worse` tasks the reference passed and the candidate
    failed, `better` the other way. Under H0 (the candidate is not worse) each discordant pair is a fair coin.
    The exact conditional p-value (McNemar 1947, exact form) is P(Binomial(worse + better, 1/2) >= worse);
    the mid-p value (the default) counts the observed outcome half: P(X > worse) + P(X = worse) / 2.
    Fagerland, Lydersen & Laake (2013), "The McNemar test for binary matched-pairs data: mid-p and asymptotic
    are better than exact conditional", show the mid-p test keeps its nominal level in practice while the
    exact one is needlessly conservative: the gate needs the power at a hundred domains. No discordant pair
    gives 1."""
    if worse < 0 or better < 0:
        raise ValueError(f"discordant counts must be >= 0, got {worse}, {better}")
    m = worse + better
    if m == 0:
        return 1.0
    # P(X = k) = C(m, k) / 2^m in log space: exact enough, and m may be tens of thousands (every domain pooled)
    log_half = m * math.log(0.5)
    log_c = math.lgamma(m + 1)
    terms = [math.exp(log_c - math.lgamma(k + 1) - math.lgamma(m - k + 1) + log_half) for k in range(worse, m + 1)]
    if mid:
        terms[0] /= 2
    return min(1.0, math.fsum(terms))


def paired_diff_interval(
    both: int, cand_only: int, ref_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Interval for p_cand - p_ref when both models answered the same n tasks: Newcombe (1998), "Improved
    confidence intervals for the difference between binomial proportions based on paired data", method 10
    (Wilson intervals of each margin, combined with the continuity-corrected phi correlation of the 2x2
    table). It is narrower than the unpaired interval by as much as the two models agree."""
    n = both + cand_only + ref_only + neither
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (both + cand_only) / n, (both + ref_only) / n
    l1, u1 = wilson_interval(both + cand_only, n, confidence)
    l2, u2 = wilson_interval(both + ref_only, n, confidence)
    cross = both * neither - cand_only * ref_only
    denom = math.sqrt((both + cand_only) * (ref_only + neither) * (both + ref_only) * (cand_only + neither))
    if denom == 0:
        phi = 0.0
    elif cross > 0:
        phi = max(cross - n / 2, 0.0) / denom
    else:
        phi = cross / denom
    d = p1 - p2
    lower = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, lower), min(1.0, upper)


def benjamini_hochberg(p_values: dict[str, float]) -> dict[str, float]:
    """Benjamini-Hochberg (1995) step-up adjusted p-values: the i-th smallest (from 1) of m times m / i, made
    non-increasing from the largest down and capped at 1. Rejecting where adjusted < alpha controls the
    expected share of false rejections among the rejections (FDR), not the chance of any."""
    order = sorted(p_values, key=lambda k: (p_values[k], k))
    m, running, out = len(order), 1.0, {}
    for i in range(m - 1, -1, -1):
        key = order[i]
        running = min(running, p_values[key] * m / (i + 1))
        out[key] = min(1.0, running)
    return out


def adjust(p_values: dict[str, float], method: str) -> dict[str, float]:
    """The family's adjusted p-values: "holm", "bh" (Benjamini-Hochberg) or "none"."""
    if method == "holm":
        return holm(p_values)
    if method == "bh":
        return benjamini_hochberg(p_values)
    if method == "none":
        return dict(p_values)
    raise ValueError(f"multiple_testing must be 'holm', 'bh' or 'none', not {method!r}")
