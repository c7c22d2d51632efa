"""The pre-emption search alone (preemption.py), on running jobs placed by hand: it finds the
victims that make a head fit, lowest priority then least work lost, never below a class's
floor, and evicts nothing; the eviction then does exactly what it found."""

from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.state import PlacerConfig
from tests.placement.placement_helpers import parts, run_by_hand

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _job(jid: str, gpus: int, priority: int = 0, domain: str = "d", at: float = 0.0, **kw) -> Job:
    return Job(jid, domain, (WorkUnit("rollout", Resources(cpus=1, mem_gb=4, gpus=gpus)),), priority, submitted=at, **kw)


def _two_nodes(**cfg):
    """Node 0: two priority-0 jobs of 4 GPUs, one started at 0 and one at 90 s (neither saves);
    node 1: a priority-1 job that may not be evicted. A priority-2 head of 4 GPUs waits."""
    t = parts(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]), PlacerConfig(preempt_after_s=0, reserve_after_s=None, **cfg))
    runs = {"old": run_by_hand(t, _job("old", 4), [0], 0.0), "young": run_by_hand(t, _job("young", 4), [0], 90.0),
            "pinned": run_by_hand(t, _job("pinned", 8, priority=1, preemptible=False), [1], 0.0)}
    head = _job("urgent", 4, priority=2, at=100.0)
    t.books.enqueue(head, 100.0)
    return t, runs, head


def test_the_search_takes_the_victim_that_loses_least_and_evicts_nothing():
    t, runs, head = _two_nodes()
    assert t.preemption.unsaved_s(runs["old"], 100.0) == 100.0 and t.preemption.unsaved_s(runs["young"], 100.0) == 10.0
    nodes, victims = t.preemption.search(head, 100.0, "priority")
    assert nodes == [0] and victims == [runs["young"]]
    assert set(t.state.running) == {"old", "young", "pinned"} and t.state.preemptions == 0 and "urgent" in t.state.jobs
    assert t.preemption.search(_job("same", 4), 100.0, "priority") is None  # nothing of a lower priority than 0


def test_the_search_never_takes_a_victim_below_its_class_floor():
    t, _, head = _two_nodes(min_class_share=0.5)  # class 0 holds 8 of 16 GPUs: at its floor
    assert t.preemption.search(head, 100.0, "priority") is None
    assert t.state.failed_preempt  # not searched again until resources change


def test_the_eviction_is_what_the_search_found():
    t, _, head = _two_nodes()
    t.state.preempt_left = 1
    log = []
    assert t.preemption.preempt_for(head, 100.0, log)
    assert [(what, r.job.id) for what, r in log] == [("preempt", "young"), ("start", "urgent")]
    assert "young" in t.state.jobs and t.state.waiting_since["young"] == 100.0  # back in its queue
    assert t.state.kills["young"] == 1 and t.state.preemptions == 1 and t.state.running["urgent"].nodes == [0]
    more = _job("more", 4, priority=2, at=100.0)
    t.books.enqueue(more, 100.0)
    assert t.state.preempt_left == 0 and not t.preemption.preempt_for(more, 100.0, [])  # no searches left this pass
