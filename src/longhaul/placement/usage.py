"""What each domain has used, for the placer's fair-share order: an exponentially decayed record
of the share of the cluster it held.

A domain's *level* is the mean share it held over roughly the last tau = `half_life_s / ln 2`
seconds (each past second weighs 2^(-age / half_life_s) / tau), with what it holds now counted
as if held `lookahead_s` longer, so a job counts the moment it starts and one pass does not
start a burst of one domain's jobs. Ordering by level per weight is weighted fair queueing over
GPU-seconds with a memory, like Slurm's fair-share with `PriorityDecayHalfLife`: a domain that
just ran a large gang waits while the others catch up, and a domain that was idle comes back
with a clean slate rather than a banked credit (it does not burst when it returns).
`half_life_s=None` keeps only the share held now (the instantaneous share).

Why not `held + mean`: a domain whose single gang is larger than its entitlement holds nothing
at the moment its gang ends, while the others hold the whole cluster, so counting `held` in
full makes the others look richer than they are exactly when the choice is made (measured on a
two-domain 1:3 test: 41% for the weight-1 domain with `held + mean`, 28% with a 10-minute
lookahead).

It owns the arithmetic only; what a job is charged (GPU or dominant share) is the placer's.
"""

from __future__ import annotations

import math
from collections import defaultdict


class Usage:
    def __init__(self, half_life_s: float | None, lookahead_s: float = 0.0):
        self.lookahead = lookahead_s
        self.tau = half_life_s / math.log(2) if half_life_s else None  # time constant of the decay
        self.held: dict[str, float] = defaultdict(float)  # domain -> share held now
        self.past: dict[str, float] = defaultdict(float)  # domain -> decayed share-seconds, as of `at`
        self.at: dict[str, float] = {}

    def _settle(self, d: str, now: float) -> None:
        if self.tau is None:
            return
        dt = max(0.0, now - self.at.get(d, now))
        if dt:
            keep = math.exp(-dt / self.tau)
            self.past[d] = self.past[d] * keep + self.held[d] * self.tau * (1.0 - keep)
        self.at[d] = max(now, self.at.get(d, now))

    def acquire(self, d: str, share: float, now: float) -> None:
        self._settle(d, now)
        self.held[d] += share

    def release(self, d: str, share: float, now: float) -> None:
        self._settle(d, now)
        self.held[d] = max(0.0, self.held[d] - share)

    def level(self, d: str, now: float, extra: float = 0.0) -> float:
        """The decayed mean share held up to now, plus the share held now x lookahead / tau;
        `extra`: as if it held that much more (or less) now."""
        held = max(0.0, self.held[d] + extra)
        if self.tau is None:
            return held
        self._settle(d, now)
        return (self.past[d] + held * self.lookahead) / self.tau
