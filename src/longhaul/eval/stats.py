"""Small-sample statistics for pass rates: Wilson intervals, exact McNemar, paired bootstrap."""

from __future__ import annotations

import math
import random


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(before: list[bool], after: list[bool]) -> dict:
    """Exact two-sided McNemar test on paired outcomes (binomial test on discordant pairs)."""
    if len(before) != len(after):
        raise ValueError("paired outcomes need equal lengths")
    b = sum(1 for x, y in zip(before, after) if x and not y)  # lost
    c = sum(1 for x, y in zip(before, after) if y and not x)  # gained
    n = b + c
    if n == 0:
        return {"gained": c, "lost": b, "p_value": 1.0}
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return {"gained": c, "lost": b, "p_value": min(1.0, 2 * tail)}


def paired_bootstrap(before: list[bool], after: list[bool], iters: int = 10000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the difference in pass rate (after - before), resampling tasks."""
    n = len(before)
    rng = random.Random(seed)
    diffs = [int(y) - int(x) for x, y in zip(before, after)]
    stats = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(iters))
    return (stats[int(0.025 * iters)], stats[int(0.975 * iters) - 1])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c,k)/C(n,k) as a product, stable for large n
        prod *= 1.0 - k / i
    return 1.0 - prod


def bootstrap_mean(values: list[float], iters: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the mean of per-task values, resampling tasks."""
    n = len(values)
    rng = random.Random(seed)
    stats = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(iters))
    return (stats[int(0.025 * iters)], stats[int(0.975 * iters) - 1])
