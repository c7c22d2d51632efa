"""What a blocked head keeps (holds.py): GPUs for one pass (`hold_for_first`), alone and in a
pass, where backfill would otherwise hand them to smaller jobs; and nodes drained for it
(reservations), which no other job may use."""

from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import PLACEMENT, FreeView, Job, WorkUnit
from longhaul.placement.placer import Placer, PlacerConfig
from tests.placement.placement_helpers import parts

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _unit(gpus: int, kind: str = "rollout") -> WorkUnit:
    return WorkUnit(kind, Resources(cpus=1, mem_gb=4, gpus=gpus))


def _job(jid: str, gpus: int, domain: str = "rich", at: float = 0.0, units: int = 1) -> Job:
    return Job(jid, domain, (_unit(gpus),) * units, submitted=at)


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


def _gang_and_small_jobs(p: Placer) -> list[str]:
    p.submit(_job("gang", 8, domain="poor", at=1.0), 1.0)  # a whole node: the fair order serves "poor" first
    for k in range(4):
        p.submit(_job(f"small{k}", 1, at=1.0), 1.0)
    return _started(p.schedule(10.0))


def test_without_a_hold_small_jobs_take_the_gpus_a_whole_node_head_waits_for():
    p = _busy_pair()
    assert _gang_and_small_jobs(p) == [f"small{k}" for k in range(4)]  # two of them on node 1
    p.release("other-two", 20.0)
    assert _started(p.schedule(20.0)) == []


def test_a_held_gpu_count_is_not_work_conserving():
    p = _busy_pair(hold_for_first=True)
    assert _gang_and_small_jobs(p) == []  # 8 GPUs free in all, all held for the gang, which fits nowhere


def test_gpus_kept_for_a_blocked_head_keep_gpu_jobs_out_for_one_pass():
    c = Cluster([Node("n0", NODE, "r")])
    c.allocate("busy", [(0, Resources(cpus=1, mem_gb=4, gpus=4))])  # 4 GPUs free
    holds = parts(c, PlacerConfig(hold_for_first=True)).holds
    holds.begin_pass()
    holds.keep_for(_job("gang", 8), rank=-1)
    holds.keep_for(_job("gang2", 8), rank=-1)  # one head a rank
    assert holds.gpus_kept == 8
    assert holds.keeps_out(_job("small", 2)) and not holds.keeps_out(Job("cpu", "d", (WorkUnit("sandbox", Resources(cpus=1)),)))
    holds.begin_pass()  # the next pass chooses again
    assert not holds.keeps_out(_job("small", 2))
    off = parts(c, PlacerConfig(hold_for_first=False)).holds
    off.keep_for(_job("gang", 8), rank=-1)
    assert not off.keeps_out(_job("small", 2))


def test_a_reservation_drains_the_nodes_with_the_most_free_and_blocks_them_for_others():
    c = Cluster([Node(f"n{i}", NODE, "r") for i in range(3)])
    for i, used in enumerate((6, 2, 4)):  # free GPUs: 2, 6, 4
        c.allocate(f"busy{i}", [(i, Resources(cpus=1, mem_gb=4, gpus=used))])
    t = parts(c)
    t.holds.reserve(_job("gang", 8, units=2))
    assert t.state.reserved == {"gang": {1, 2}} and t.state.node_reserved == {1: "gang", 2: "gang"}
    blocked = t.holds.blocked()
    assert [i in blocked for i in range(3)] == [False, True, True]
    assert not any(i in t.holds.blocked(own=t.state.reserved["gang"]) for i in range(3))  # open to the job they are drained for
    first_fit = PLACEMENT.get_fn("first_fit")
    assert first_fit(FreeView(c, blocked=blocked), _job("small", 1), t.state.cfg) == [0]  # not on node 1, first with room
    assert first_fit(FreeView(c, blocked=blocked), _job("four", 4), t.state.cfg) is None  # only drained nodes have room
    assert t.holds.drop("gang") and not t.state.reserved and not t.state.node_reserved
    assert not t.holds.drop("gang")
