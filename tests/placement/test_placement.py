"""The cluster ledger and node choice: all-or-nothing allocation, exact books, packing by rack,
co-location of large weights, cache affinity, no stranded GPUs."""

import pytest

from longhaul.placement.cluster import Cluster, Node, Oversubscribed, Resources
from longhaul.placement.placement import PLACEMENT, FreeView, Job, WorkUnit, shards
from longhaul.placement.placer import PlacerConfig

GPU8 = Resources(cpus=32, mem_gb=256, gpus=8)
CPU64 = Resources(cpus=64, mem_gb=128)


def _cluster(racks: int = 2, gpu_nodes: int = 2, cpu_nodes: int = 0) -> Cluster:
    nodes = []
    for r in range(racks):
        nodes += [Node(f"r{r}c{k}", CPU64, f"rack{r}") for k in range(cpu_nodes)]
        nodes += [Node(f"r{r}g{k}", GPU8, f"rack{r}") for k in range(gpu_nodes)]
    return Cluster(nodes)


def _gpu_job(jid: str, units: int, gpus: int, checkpoint_gb: float = 0.0, **kw) -> Job:
    return Job(jid, "d", (WorkUnit("rollout", Resources(cpus=2, mem_gb=8, gpus=gpus)),) * units,
               checkpoint_gb=checkpoint_gb, checkpoint="ckpt" if checkpoint_gb else "", **kw)


def _choose(cluster: Cluster, job: Job, policy: str = "pack", **cfg):
    return PLACEMENT.get_fn(policy)(FreeView(cluster), job, PlacerConfig(**cfg))


def test_resources_count_in_exact_integers():
    assert Resources(0.1, 0.5, 1).units() == (100, 512, 1)
    assert Resources.of((1500, 2048, 2)) == Resources(1.5, 2.0, 2)
    with pytest.raises(ValueError):
        Resources(cpus=-1)


def test_allocate_is_all_or_nothing_and_books_balance():
    c = _cluster(racks=1, gpu_nodes=2)
    c.allocate("a", [(0, Resources(8, 64, 4)), (0, Resources(8, 64, 4))])  # two units on one node add up
    assert c.free[0] == [16_000, 128 * 1024, 0]
    with pytest.raises(Oversubscribed, match="r0g0"):
        c.allocate("b", [(1, Resources(1, 1, 1)), (0, Resources(0, 0, 1))])
    assert c.free[1] == list(c.cap[1]) and "b" not in c.holdings  # nothing of b was taken
    with pytest.raises(Oversubscribed, match="already holds"):
        c.allocate("a", [(1, Resources(1, 1, 1))])
    c.check()
    assert c.release("a") and c.free[0] == list(c.cap[0]) and c.release("a") == []
    c.check()
    assert c.used_fraction() == (0.0, 0.0, 0.0)


def test_first_fit_spans_racks_but_pack_keeps_large_weights_in_one_rack():
    c = _cluster(racks=2, gpu_nodes=2)
    c.allocate("busy", [(0, Resources(2, 8, 4))])  # rack0 has 12 GPUs free, rack1 16
    job = _gpu_job("j", 4, 4, checkpoint_gb=64.0)  # 16 GPUs
    ff = _choose(c, job, "first_fit")
    assert len({c.rack_of[i] for i in ff}) == 2
    packed = _choose(c, job, "pack")
    assert {c.rack_of[i] for i in packed} == {"rack1"}


def test_pack_fills_the_tightest_rack_when_weights_are_small():
    c = _cluster(racks=2, gpu_nodes=2)
    c.allocate("busy", [(0, Resources(2, 8, 4))])
    small = _gpu_job("s", 1, 4, checkpoint_gb=3.0)
    assert c.rack_of[_choose(c, small, "pack")[0]] == "rack0"  # the fuller rack, keeping rack1 whole
    assert _choose(c, small, "pack") == [0]  # and the fuller node in it


def test_pack_prefers_nodes_that_hold_the_checkpoint():
    c = _cluster(racks=2, gpu_nodes=2)
    c.note_checkpoint(3, "ckpt")
    assert _choose(c, _gpu_job("j", 1, 8, checkpoint_gb=16.0), "pack") == [3]
    c.note_checkpoint(3, "other")
    c.note_checkpoint(3, "third")  # two cache slots: "ckpt" is evicted
    assert not c.has_checkpoint(3, "ckpt") and 3 not in c.cached_on["ckpt"]


def test_cpu_work_keeps_off_gpu_nodes_and_never_strands_their_gpus():
    c = Cluster([Node("gpu", GPU8, "rack0"), Node("cpu", CPU64, "rack0")])
    sandbox = Job("sb", "d", (WorkUnit("sandbox", Resources(cpus=16, mem_gb=32), loads_checkpoint=False),))
    assert _choose(c, sandbox, "first_fit") == [0]  # the baseline takes the first node with room
    assert _choose(c, sandbox, "pack") == [1]  # the CPU node, although the GPU node comes first
    c.allocate("fill", [(1, CPU64)])
    # the GPU node has 32 CPUs for 8 free GPUs; keeping 4 CPUs a free GPU, nothing CPU-only fits
    assert _choose(c, sandbox, "pack", cpus_per_gpu=4) is None
    assert _choose(c, sandbox, "pack", cpus_per_gpu=1) == [0]


def test_a_search_never_double_counts_a_node():
    c = _cluster(racks=1, gpu_nodes=1)
    assert _choose(c, _gpu_job("j", 2, 4), "pack") == [0, 0]
    assert _choose(c, _gpu_job("j", 3, 4), "pack") is None
    assert _choose(c, _gpu_job("j", 3, 4), "first_fit") is None


def test_unknown_policy_is_one_clear_error():
    from longhaul.errors import LonghaulError

    with pytest.raises(LonghaulError, match="unknown placement policy 'packk'; did you mean 'pack'"):
        PLACEMENT.get_fn("packk")


def test_an_elastic_batch_splits_into_one_shard_a_worker_that_together_ask_what_it_asks():
    worker, pool = WorkUnit("rollout", Resources(cpus=8, mem_gb=64, gpus=4)), WorkUnit("sandbox", Resources(cpus=16, mem_gb=32), loads_checkpoint=False)
    batch = Job("b", "d", (worker,) * 3 + (pool,) * 7, 1, 16.0, "d/policy", True, 5.0, 300.0, elastic=True)
    parts = shards(batch)
    assert [p.id for p in parts] == ["b#0", "b#1", "b#2"]
    assert [sum(u.loads_checkpoint for u in p.units) for p in parts] == [1, 1, 1]  # one worker each
    assert [len(p.units) - 1 for p in parts] == [3, 2, 2]  # the 7 pools dealt in turn
    assert tuple(sum(p.total[k] for p in parts) for k in range(3)) == batch.total
    assert all((p.domain, p.priority, p.checkpoint_gb, p.submitted, p.checkpoint_every_s, p.elastic) == ("d", 1, 16.0, 5.0, 300.0, False)
               for p in parts)
    assert shards(Job("g", "d", (worker,) * 3)) == (Job("g", "d", (worker,) * 3),)  # a gang (not elastic) stays whole
    one = Job("e", "d", (worker, pool), elastic=True)
    assert shards(one) == (one,)  # one worker: nothing to split
