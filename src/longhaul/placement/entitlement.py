"""What each domain is entitled to, estimated online for the placer: the weighted max-min split
(water-fill) of what its priority class uses over what its domains ask for, both with the
placer's usage memory. It owns that estimate; the order, the holds and the victims are the
placer's.

The fair-share order alone (lowest use per weight first) cannot tell a domain that is entitled
to all it asks (its demand is below the water line) from one at the line: both may be the
lowest of the moment. A pre-emption or a held node that helps the first is fair; between two
domains below the line it only moves the wait from one to the other (and a wait below the line
is what the benchmark's fairness error counts). Demand is the decayed share used plus the
decayed share of what waits (share x time waiting, like the benchmark's q_d), over the same
half-life as the usage, so a domain is judged on roughly the last hours, not on one pass.

Not a guarantee: the split is of what the class used, not of the cluster, and a domain with one
gang larger than its entitlement is over it while the gang runs and under it while it waits.
"""

from __future__ import annotations

from longhaul.placement.usage import Usage


def water_fill(capacity: float, demand: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """Weighted max-min fair split of `capacity`: nobody gets more than it demands, the rest is
    shared in proportion to weight among those still wanting more. O(n log n): domains in order
    of demand per weight, each either satisfied or cut at the level the rest share."""
    out = {d: 0.0 for d in demand}
    active = sorted((d for d, v in demand.items() if v > 0), key=lambda d: demand[d] / weight[d])
    left, w = capacity, sum(weight[d] for d in active)
    for k, d in enumerate(active):
        level = left / w if w > 0 else 0.0
        if demand[d] / weight[d] > level:  # this one and all after it are cut at the level
            for e in active[k:]:
                out[e] = level * weight[e]
            return out
        out[d] = demand[d]
        left -= demand[d]
        w -= weight[d]
    return out


class Entitlements:
    def __init__(self, half_life_s: float | None, weights: dict[str, float], refresh_s: float = 60.0):
        self.weights = weights
        self.refresh_s, self.at = refresh_s, -float("inf")  # decayed means over hours move little in a minute: split once a minute
        self.wanted = Usage(half_life_s)  # domain -> decayed share its waiting jobs ask for (None: the share waiting now)
        self.priority: dict[str, int] = {}  # domain -> its class (the priority of its latest job)
        self.of: dict[str, float] = {}  # domain -> its entitlement, as a level (decayed mean share), at the latest `update`
        self.used: dict[str, float] = {}  # domain -> its level then

    def want(self, domain: str, priority: int, share: float, now: float) -> None:
        """A job of `domain` asking for `share` started waiting."""
        self.priority[domain] = priority
        self.wanted.acquire(domain, share, now)
        if domain not in self.of:
            self.at = -float("inf")  # a domain not split yet: split at the next `update`, not a minute later

    def unwant(self, domain: str, share: float, now: float) -> None:
        self.wanted.release(domain, share, now)

    def update(self, usage: Usage, now: float) -> None:
        """Split each class's decayed use over its domains' decayed demands (use + waiting), by
        weight (at most once every `refresh_s`)."""
        if now - self.at < self.refresh_s:
            return
        self.at = now
        used = {d: usage.level(d, now) for d in self.priority}
        by_class: dict[int, dict[str, float]] = {}
        for d, p in self.priority.items():
            by_class.setdefault(p, {})[d] = used[d] + self.wanted.level(d, now)
        self.of = {}
        for cls in by_class.values():
            self.of.update(water_fill(sum(used[d] for d in cls), cls, {d: self.weights.get(d, 1.0) for d in cls}))
        self.used = used

    def under(self, domain: str) -> bool:
        """Whether `domain` used less than its entitlement (as of the latest `update`)."""
        return self.used.get(domain, 0.0) < self.of.get(domain, 0.0) * (1 - 1e-9) - 1e-15

    def over(self, domain: str, level: float) -> float:
        """How far `level` (a use of `domain`'s) stands above its entitlement (negative: below)."""
        return level - self.of.get(domain, 0.0)
