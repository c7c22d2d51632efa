"""The placer's online entitlement (entitlement.py): its water-fill, which the benchmark's measure
shares, equals a plain loop on random demands, and a domain is under its entitlement when it
used less than the weighted max-min split of its class's use gives it."""

import random

import pytest

from longhaul.placement.entitlement import Entitlements, water_fill
from longhaul.placement.usage import Usage


def reference(capacity, demand, weight):
    """The plain water-fill: share what is left by weight, satisfy whoever that covers, repeat."""
    out, active, left = {d: 0.0 for d in demand}, {d for d, v in demand.items() if v > 0}, capacity
    while active and left > 1e-12:
        w = sum(weight[d] for d in active)
        done = {d for d in active if demand[d] - out[d] <= left * weight[d] / w}
        if not done:
            for d in active:
                out[d] += left * weight[d] / w
            return out
        for d in done:
            left -= demand[d] - out[d]
            out[d] = demand[d]
        active -= done
    return out


def test_water_fill_matches_the_benchmarks_reference():
    rng, worst = random.Random(0), 0.0
    for _ in range(500):
        n = rng.randint(1, 40)
        demand = {str(i): rng.choice([0.0, rng.lognormvariate(0, 1.5)]) for i in range(n)}
        weight = {str(i): rng.lognormvariate(0, 0.8) for i in range(n)}
        cap = rng.uniform(0, 1.5) * sum(demand.values())
        got, want = water_fill(cap, demand, weight), reference(cap, demand, weight)
        worst = max(worst, max(abs(got[d] - want[d]) for d in demand))
    assert worst < 1e-9, f"max difference {worst:g}"


def test_a_domain_below_the_water_line_is_entitled_to_what_it_asks():
    usage, ent = Usage(None), Entitlements(None, {"a": 1.0, "b": 1.0, "c": 2.0})
    for d, held, waiting in (("a", 0.5, 0.5), ("b", 0.1, 0.1), ("c", 0.4, 0.0)):
        usage.acquire(d, held, 0.0)
        ent.want(d, 1, waiting, 0.0)
    ent.update(usage, 0.0)  # 1.0 used; demands a 1.0, b 0.2, c 0.4: b gets its 0.2, a and c 0.4 each
    assert ent.of == pytest.approx({"a": 0.4, "b": 0.2, "c": 0.4})
    assert not ent.under("a") and ent.under("b") and not ent.under("c")
    assert ent.over("a", 0.5) == pytest.approx(0.1)
