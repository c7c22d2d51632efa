"""Holding nodes for blocked heads (holds.py) and the learnt duration estimates they use
(durations.py): the held node is the one closest to fitting the head, jobs ranked after it start
elsewhere (not nowhere, as with a held GPU count), and with EASY backfill a job expected to end
before the head can start may use the held node meanwhile."""

import pytest

from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.durations import Durations
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.placer import Placer, PlacerConfig

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _unit(gpus: int, kind: str = "rollout") -> WorkUnit:
    return WorkUnit(kind, Resources(cpus=1, mem_gb=4, gpus=gpus))


def _job(jid: str, gpus: int, domain: str = "rich", at: float = 0.0, kind: str = "rollout") -> Job:
    return Job(jid, domain, (_unit(gpus, kind),), submitted=at)


def _started(log) -> list[str]:
    return sorted(r.job.id for what, r in log if what == "start")


def _busy_pair(**cfg) -> Placer:
    """Two 8-GPU nodes of one domain's jobs: node 0 has 2 GPUs free, node 1 has 6."""
    p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]),
               PlacerConfig(preempt=False, reserve_after_s=None, **cfg), {"rich": 1.0, "poor": 1.0})
    for jid, gpus in (("six", 6), ("two", 2), ("other-two", 2)):
        p.submit(_job(jid, gpus), 0.0)
        p.schedule(0.0)
    p.release("two", 0.0)
    assert [p.c.free[i][2] for i in range(2)] == [2, 6] and p.running["other-two"].nodes == [1]
    return p


def _gang_and_small_jobs(p: Placer, small_kind: str = "rollout") -> list[str]:
    p.submit(_job("gang", 8, domain="poor", at=1.0), 1.0)  # a whole node: the fair order serves "poor" first
    for k in range(4):
        p.submit(_job(f"small{k}", 1, at=1.0, kind=small_kind), 1.0)
    return _started(p.schedule(10.0))


def test_a_held_node_keeps_what_frees_for_the_head_and_the_rest_runs_elsewhere():
    p = _busy_pair(hold_nodes=1)
    assert _gang_and_small_jobs(p) == ["small0", "small1"]  # on node 0's two free GPUs; node 1 is held
    assert all(p.running[f"small{k}"].nodes == [0] for k in range(2)) and p.c.free[1][2] == 6
    p.release("other-two", 20.0)
    assert _started(p.schedule(20.0)) == ["gang"]  # node 1 is whole again: the gang starts at once


def test_without_holds_small_jobs_take_the_gpus_a_whole_node_head_waits_for():
    p = _busy_pair()
    assert _gang_and_small_jobs(p) == [f"small{k}" for k in range(4)]  # two of them on node 1
    p.release("other-two", 20.0)
    assert _started(p.schedule(20.0)) == []


def test_a_held_gpu_count_is_not_work_conserving():
    p = _busy_pair(hold_for_first=True)
    assert _gang_and_small_jobs(p) == []  # 8 GPUs free in all, all held for the gang, which fits nowhere


def _teach(p: Placer, kind: str, gpus: int, seconds: float) -> None:
    for k in range(3):
        p.durations.observe(_job(f"seen-{kind}-{k}", gpus, kind=kind), seconds)


def test_easy_backfill_lets_in_jobs_expected_to_end_before_the_head_starts():
    def started(small_kind):
        p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]),
                   PlacerConfig(preempt=False, reserve_after_s=None, hold_nodes=1, easy_backfill=True), {"rich": 1.0, "poor": 1.0})
        _teach(p, "rollout", 6, 10_000.0)  # node 0's 6-GPU job: expected to end at 10,000 s
        _teach(p, "rollout", 2, 1000.0)  # node 1's 2-GPU job: at 1,000 s, so the gang is expected to start there then
        _teach(p, "short", 1, 100.0)
        _teach(p, "long", 1, 5000.0)
        for jid, gpus in (("six", 6), ("two", 2), ("other-two", 2)):
            p.submit(_job(jid, gpus), 0.0)
            p.schedule(0.0)
        p.release("two", 0.0)
        got = _gang_and_small_jobs(p, small_kind)
        return got, sorted({p.running[j].nodes[0] for j in got})
    # node 1 is held for the gang until 1,000 s: jobs ending by then may use it, the others keep to node 0
    assert started("short") == ([f"small{k}" for k in range(4)], [0, 1])
    assert started("long") == (["small0", "small1"], [0])


def test_the_held_node_is_the_one_expected_to_fit_the_head_first():
    p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]),
               PlacerConfig(preempt=False, reserve_after_s=None, hold_nodes=1, easy_backfill=True), {"rich": 1.0, "poor": 1.0})
    _teach(p, "rollout", 6, 100.0)  # node 0 (2 GPUs free) frees at 100 s; node 1 (6 free) at 1,000 s
    _teach(p, "rollout", 2, 1000.0)
    for jid, gpus in (("six", 6), ("two", 2), ("other-two", 2)):
        p.submit(_job(jid, gpus), 0.0)
        p.schedule(0.0)
    p.release("two", 0.0)
    _gang_and_small_jobs(p, "unseen")
    assert p._held == {0: pytest.approx(100.0)}  # fewer GPUs free now, but free sooner
    assert p._expected_end("six", 150.0) == pytest.approx(250.0)  # past its estimate: one more estimate from now


def test_estimates_are_running_medians_by_kind_then_shape():
    d = Durations(window=3, min_runs=2, default_s=60.0)
    a1, b1, a8 = _job("a", 1, domain="a"), _job("b", 1, domain="b"), _job("c", 8, domain="a")
    assert d.expect(a1) == 60.0  # nothing seen yet
    d.observe(a8, 7.0)
    assert d.expect(a1) == 7.0  # too few of its kind or shape: the median of everything
    for s in (10.0, 30.0):
        d.observe(b1, s)
    assert d.expect(a1) == 30.0  # its shape, in any domain (median of two: the upper one)
    for s in (1.0, 2.0, 3.0, 100.0):
        d.observe(a1, s)
    assert d.expect(a1) == 3.0  # its own kind: median of the last three (2, 3, 100)


def test_only_runs_that_finished_uninterrupted_teach_the_estimates():
    p = Placer(Cluster([Node("n0", NODE, "r")]), PlacerConfig(preempt_after_s=0.0, reserve_after_s=None))
    p.submit(Job("low", "d", (_unit(8),), priority=0), 0.0)
    p.schedule(0.0)
    p.submit(Job("high", "d", (_unit(8),), priority=1), 5.0)
    p.schedule(5.0)  # "low" is evicted after 5 s: that is not how long it takes
    p.release("high", 50.0)
    p.schedule(50.0)
    p.release("low", 80.0)  # a restarted run: not counted either
    assert p.durations.expect(Job("x", "d", (_unit(8),))) == 45.0


def test_entitled_holds_hold_nodes_only_for_domains_under_their_entitlement():
    p = _busy_pair(hold_nodes=1, entitled_holds=True)
    assert _gang_and_small_jobs(p) == ["small0", "small1"]  # poor holds nothing and waits: under, so node 1 is held
    p = _busy_pair(hold_nodes=1, entitled_holds=True)
    p.submit(_job("rich-gang", 8, at=1.0), 1.0)  # rich's own gang heads the pass: rich is all its class uses, not under
    for k in range(4):
        p.submit(_job(f"small{k}", 1, at=2.0), 2.0)
    assert _started(p.schedule(10.0)) == [f"small{k}" for k in range(4)]  # nothing held: two of them on node 1
    p = _busy_pair(hold_nodes=1)
    p.submit(_job("rich-gang", 8, at=1.0), 1.0)
    for k in range(4):
        p.submit(_job(f"small{k}", 1, at=2.0), 2.0)
    assert _started(p.schedule(10.0)) == ["small0", "small1"]  # every blocked head holds: node 1 is kept for rich's gang


def test_hold_for_under_keeps_gpus_from_domains_not_under_their_share_only():
    def started(**cfg):
        p = _busy_pair(**cfg)
        p.submit(_job("other0", 1, domain="other", at=2.0), 2.0)  # a third domain, under its share like poor
        return _gang_and_small_jobs(p)
    assert started() == ["other0"] + [f"small{k}" for k in range(4)]
    # poor's gang keeps its 8 GPUs (half the cluster's 16) from rich, over its share; other, under its own, still starts
    assert started(hold_for_under=0.5) == ["other0"]
