"""Shared helpers of the task scheduler's tests: synthetic domains and a chi-square p-value."""

import math
from types import SimpleNamespace

from longhaul.runtime.domains import Domain


def synthetic(name: str, n_tasks: int = 64, **kw) -> Domain:
    return Domain(name, [SimpleNamespace(task_id=f"{name}/{i}") for i in range(n_tasks)], **kw)


def _lower_gamma_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    for n in range(1, 10_000):
        term *= x / (a + n)
        total += term
        if abs(term) < abs(total) * 1e-15:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_gamma_fraction(a: float, x: float) -> float:
    # modified Lentz continued fraction for Q(a, x), valid for x > a + 1
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, stat/2)."""
    a, x = df / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    return 1.0 - _lower_gamma_series(a, x) if x < a + 1 else _upper_gamma_fraction(a, x)


def chi_square(counts: list[int], weights: list[float]) -> tuple[float, float]:
    """Pearson's statistic of `counts` against shares proportional to `weights`, and its p-value."""
    n, w = sum(counts), sum(weights)
    stat = sum((c - n * wi / w) ** 2 / (n * wi / w) for c, wi in zip(counts, weights))
    return stat, chi2_sf(stat, len(counts) - 1)
