"""Shared helpers of the scheduling tests: synthetic domains, a chi-square p-value, the placer's books."""

import math
from types import SimpleNamespace

from longhaul.runtime.scheduling import Domain


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


def check_books(placer, n_nodes: int) -> None:
    """Every node within capacity and the books exact; every running job holds exactly what its
    units need where the placer put them; the ledger holds only running jobs, told victims saving
    (handover.py) and the claims of the heads awaiting them, and a claim with its saving victims
    holds at least what its head needs on each of its nodes."""
    placer.c.check()
    for run in placer.running.values():
        held = {}
        for i, u in zip(run.nodes, run.job.needs):
            held[i] = tuple(a + b for a, b in zip(held.get(i, (0, 0, 0)), u))
        assert sorted(placer.c.holdings[run.job.id]) == sorted(held.items())
    assert not (set(placer.running) & set(placer.jobs)) and not (set(placer.stopping) & (set(placer.running) | set(placer.jobs)))
    assert set(placer.c.holdings) <= set(placer.running) | set(placer.stopping) | set(placer.awaiting)
    for jid, (at, _, victims) in placer.awaiting.items():
        assert jid in placer.jobs and any(v in placer.stopping for v in victims)
        have = {}
        for holder in [jid, *(v for v in victims if v in placer.stopping)]:
            for i, u in placer.c.holdings.get(holder, []):
                have[i] = tuple(a + b for a, b in zip(have.get(i, (0, 0, 0)), u))
        for i, u in zip(at, placer.jobs[jid].needs):
            have[i] = tuple(a - b for a, b in zip(have.get(i, (0, 0, 0)), u))
        assert all(min(v) >= 0 for v in have.values()), (jid, have)
    assert all(i not in placer.node_reserved or placer.node_reserved[i] in placer.jobs for i in range(n_nodes))
