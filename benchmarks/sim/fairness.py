"""The fairness measure's building blocks, for the simulator's report (`cluster_sim`): clock
hours, a per-domain ledger of shares held and asked for split into those hours, and the
entitlement those shares are judged against (priorities first, then the weighted water-fill the
placer's own estimate uses). What the measure counts is described in `cluster_sim`."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from longhaul.placement.entitlement import water_fill  # the measure's split is the placer's estimate's

HOUR = 3600.0
FAIRNESS_HOURS = 6  # fairness is judged over windows this long (jobs run up to a day; one gang can exceed a domain's hourly entitlement)


def entitlement(capacity: float, demand: dict[str, float], weight: dict[str, float], priority: dict[str, int]) -> dict[str, float]:
    """Priorities first (each class gets what it demands while capacity lasts), weights within."""
    out, left = {}, capacity
    for p in sorted({priority[d] for d in demand}, reverse=True):
        cls = {d: v for d, v in demand.items() if priority[d] == p}
        got = water_fill(min(left, sum(cls.values())), cls, weight)
        out.update(got)
        left -= sum(got.values())
    return out


def hour_range(a: float, b: float) -> range:
    """The clock hours the interval [a, b) touches."""
    return range(int(a // HOUR), int(math.ceil(b / HOUR)))


def split_by_hour(a: float, b: float):
    """(hour, seconds) of the interval [a, b) in each clock hour it touches."""
    t = a
    while t < b:
        end = min(b, (int(t // HOUR) + 1) * HOUR)
        yield int(t // HOUR), end - t
        t = end


@dataclass
class Ledger:
    """Per-domain integrals of one share measure (held x time, queued x time), split into hours."""
    held: dict = field(default_factory=lambda: defaultdict(float))  # domain -> share held now
    queued: dict = field(default_factory=lambda: defaultdict(float))  # domain -> share its waiting jobs ask for
    since: dict = field(default_factory=dict)  # domain -> time of the last integration
    used: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))  # hour -> domain -> share-seconds
    wanted: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))  # hour -> domain -> share-seconds

    def advance(self, d: str, now: float) -> None:
        h, q = self.held[d], self.queued[d]
        if h > 0 or q > 0:
            for hour, dt in split_by_hour(self.since.get(d, now), now):
                self.used[hour][d] += h * dt
                self.wanted[hour][d] += q * dt
        self.since[d] = now

    def change(self, d: str, now: float, held: float = 0.0, queued: float = 0.0) -> None:
        self.advance(d, now)
        self.held[d] = max(0.0, self.held[d] + held)
        self.queued[d] = max(0.0, self.queued[d] + queued)
