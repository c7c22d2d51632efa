"""Shared helpers of the placer's tests: a check of its books, and its parts built by hand over
one state (to test a part without a `Placer` pass)."""

from types import SimpleNamespace

from longhaul.placement.books import Books
from longhaul.placement.cluster import Cluster
from longhaul.placement.handover import Handover
from longhaul.placement.holds import Holds
from longhaul.placement.placement import PLACEMENT
from longhaul.placement.preemption import Preemption
from longhaul.placement.state import PlacerConfig, PlacerState


def parts(cluster: Cluster, cfg: PlacerConfig | None = None, weights: dict[str, float] | None = None) -> SimpleNamespace:
    """The placer's parts over a fresh state: `.state`, `.holds`, `.books`, `.handover`, `.preemption`."""
    state = PlacerState(cluster, cfg or PlacerConfig(), weights or {})
    holds = Holds(state)
    books = Books(state, holds)
    handover = Handover(state, books, holds)
    preemption = Preemption(state, PLACEMENT.get_fn(state.cfg.policy), books, holds, handover)
    return SimpleNamespace(state=state, holds=holds, books=books, handover=handover, preemption=preemption)


def run_by_hand(t: SimpleNamespace, job, nodes: list[int], now: float):
    """Queue `job` and start it on `nodes` at `now`, as a pass would."""
    t.books.enqueue(job, now)
    return t.books.start(job, nodes, now)


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
