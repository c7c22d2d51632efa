"""Placement on Ray: bundles and strategies, then the placer's decision reserved for real as a
placement group on a local Ray instance, and an infeasible job refused in one line."""

import time

import pytest

from longhaul.errors import LonghaulError
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.placer import Placer, PlacerConfig
from longhaul.placement.ray_mapping import GIB, NODE_ID, PIN, actor_options, bundles, nodes_from_ray, pins, release, reserve, strategy

WORKER = WorkUnit("rollout", Resources(cpus=1, mem_gb=0.25, gpus=0))
POOL = WorkUnit("sandbox", Resources(cpus=0.5), loads_checkpoint=False)


def test_units_become_bundles_pinned_where_the_placer_put_them():
    job = Job("j", "d", (WorkUnit("trainer", Resources(cpus=8, mem_gb=64, gpus=2)), POOL, WorkUnit("noop", Resources())))
    assert bundles(job) == [{"CPU": 8, "GPU": 2, "memory": 64 * GIB}, {"CPU": 0.5}, {"CPU": PIN}]
    cluster = Cluster([Node("aa01", Resources(16, 128, 4), "r0"), Node("bb02", Resources(16, 128, 0), "r0")])
    placer = Placer(cluster)
    placer.submit(job, 0.0)
    (what, run), = placer.schedule(0.0)
    assert pins(run, cluster) == [{NODE_ID: "aa01"}, {NODE_ID: "bb02"}, {NODE_ID: "bb02"}]
    with pytest.raises(ValueError, match="needs the cluster"):
        reserve(job, run)


def test_strategy_keeps_large_weights_on_one_node_when_they_fit():
    node = Resources(cpus=96, mem_gb=1024, gpus=8)
    big = Job("b", "d", (WorkUnit("rollout", Resources(8, 64, 4)),) * 2, checkpoint_gb=64.0)
    assert strategy(big, PlacerConfig(), node) == "STRICT_PACK"
    assert strategy(big, PlacerConfig(colocate_gb=100.0), node) == "PACK"
    assert strategy(Job("c", "d", (WorkUnit("rollout", Resources(8, 64, 4)),) * 3, checkpoint_gb=64.0), PlacerConfig(), node) == "PACK"


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, resources={"rack:r7": 1}, include_dashboard=False, log_to_driver=False,
             _system_config={"memory_monitor_refresh_ms": 0})  # no OOM kills for other processes' memory
    try:
        yield
    finally:
        ray.shutdown()


def test_the_placers_decision_is_reserved_as_a_placement_group(local_ray):
    nodes = nodes_from_ray()
    assert len(nodes) == 1 and nodes[0].rack == "r7" and nodes[0].capacity.cpus == 2.0
    assert nodes[0].name == ray.get_runtime_context().get_node_id()
    cluster = Cluster(nodes)
    placer = Placer(cluster)
    job = Job("j", "d", (WORKER, POOL))
    placer.submit(job, 0.0)
    (what, run), = placer.schedule(0.0)
    pg = reserve(job, run, cluster, timeout_s=60)
    try:
        deadline = time.monotonic() + 20  # the resource view is eventually consistent
        while ray.available_resources().get("CPU", 0.0) > 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ray.available_resources().get("CPU", 0.0) == pytest.approx(0.5)  # the group holds 1.5 of the 2 CPUs

        @ray.remote
        def node_id():
            return ray.get_runtime_context().get_node_id()

        assert ray.get(node_id.options(**actor_options(pg, 1, job)).remote()) == ray.get_runtime_context().get_node_id()
    finally:
        release(pg)


def test_a_job_the_cluster_cannot_hold_is_refused(local_ray):
    with pytest.raises(LonghaulError, match="could not reserve job 'big'"):
        reserve(Job("big", "d", (WorkUnit("rollout", Resources(cpus=3)),)), timeout_s=2)
