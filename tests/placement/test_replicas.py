"""Replicated training runs (`Job.replica`): with `split_elastic` a run's data-parallel replicas
start as room frees and share one run's work; a replica whose peers work is killed (they keep
the state), the last one is told and saves, or falls back to its last save; the simulator counts
the regroups, the saves and the losses exactly."""

import dataclasses

import pytest

from benchmarks.sim.cluster_sim import Simulation, simulate
from benchmarks.sim.workload import DomainSpec, SimJob, WorkloadSpec, make_workload, notice_save_s
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, Replica, WorkUnit, shards
from longhaul.placement.placer import PRESETS, Placer, PlacerConfig
from tests.placement.placement_helpers import check_books

NODE = Resources(cpus=16, mem_gb=64, gpus=8)
TRAINER = WorkUnit("trainer", Resources(cpus=1, mem_gb=1, gpus=8))
DOMAINS = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 8, 1.0), DomainSpec("b", 1.0, 1, 1.0, 0.0, 8, 1.0)]


def _run(jid: str = "train", replicas: int = 2, at: float = 0.0, **kw) -> Job:
    return Job(jid, "a", (TRAINER,) * replicas, 0, 0.0, "a/w", True, at, 1800.0, 50.0, elastic=True,
               replica=Replica(leave_s=20.0, save_s=kw.pop("save_s", 50.0)), **kw)


def _other(jid: str, at: float, domain: str = "b", priority: int = 1, preemptible: bool = True) -> Job:
    return Job(jid, domain, (TRAINER,), priority, 0.0, f"{domain}/w", preemptible, at, 300.0)


def _nodes(n: int) -> list[Node]:
    return [Node(f"n{i}", NODE, "r") for i in range(n)]


def _cfg(**kw) -> PlacerConfig:
    return PRESETS["longhaul"].model_copy(update={"preempt_after_s": 0.0, "min_class_share": 0.0, **kw})


def test_shards_of_a_replicated_run_are_its_replicas_each_saving_alone():
    parts = shards(_run(replicas=3, save_s=270.0))
    assert [p.id for p in parts] == ["train#0", "train#1", "train#2"] and all(p.batch == "train" for p in parts)
    assert all(p.units == (TRAINER,) and p.notice_save_s == 270.0 and p.replica is not None for p in parts)
    assert shards(dataclasses.replace(_run(), elastic=False)) == (dataclasses.replace(_run(), elastic=False),)


def _working_run() -> Placer:
    """Two nodes, both working replicas of one run (loaded at 0)."""
    p = Placer(Cluster(_nodes(2)), _cfg())
    p.submit(_run(), 0.0)
    p.schedule(0.0)
    for r in p.running.values():
        r.working_from = 0.0
    return p


def test_a_replica_whose_peers_work_is_killed_and_the_last_one_is_told():
    p = _working_run()
    p.submit(_other("high", 600.0, preemptible=False), 600.0)
    log = p.schedule(600.0)
    # a peer keeps the state: killing one loses its 20 s leave, not the 600 s since it started, and it kept its progress
    assert [(w, r.job.id) for w, r in log] == [("preempt", "train#0"), ("start", "high")]
    survivor = p.running["train#1"]
    assert p.handover.cadence_loss_s(survivor, 600.0) == 600.0 and not p.handover.saved_since_start(survivor, 600.0)  # now alone
    p.submit(_other("higher", 700.0, priority=2), 700.0)
    assert [(w, r.job.id) for w, r in p.schedule(700.0)] == [("notice", "train#1")]  # the only copy: told, it saves


def test_the_simulator_grows_a_run_as_room_frees_and_charges_the_regroup():
    busy = Job("busy", "b", (TRAINER,), 0, 0.0, "b/w", True, 0.0, 300.0)
    jobs = [SimJob(busy, 0.0, 100.0, "rollout"), SimJob(_run(at=10.0), 10.0, 200.0, "train")]
    domains = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 8, 1.0), DomainSpec("b", 1.0, 0, 1.0, 0.0, 8, 1.0)]
    r = simulate(_nodes(2), domains, jobs, PRESETS["fifo"].model_copy(update={"split_elastic": True}), 0.0, 1000.0, tick_s=10.0)
    # busy holds n0 for [0, 100]; replica 0 works from 10 alone (90 replica-s by 100), replica 1 joins at 100 (no weights to
    # copy), both regroup for 20 s, then do the 310 left at 2 a second: the run ends at 275 and never waited
    assert r["jobs_finished"] == 2 and r["delay_quantiles_s"][100] == 0.0
    assert r["replicas_regroup_gpu_hours"] == pytest.approx(2 * 8 * 20.0 / 3600) == r["preempted_gpu_hours_lost"]
    assert r["gpu_goodput"] == pytest.approx(8 * (100 + 400) / 16000.0)
    assert r["gpu_utilisation"] == pytest.approx(8 * (100 + 265 + 175) / 16000.0)
    whole = simulate(_nodes(2), domains, jobs, PRESETS["fifo"], 0.0, 1000.0, tick_s=10.0)
    assert whole["delay_quantiles_s"][100] == pytest.approx(90.0) and whole["gpu_utilisation"] == pytest.approx(8 * 500 / 16000.0)


def test_the_simulator_keeps_a_killed_replicas_work_with_its_peers():
    jobs = [SimJob(_run(), 0.0, 1000.0, "train"), SimJob(_other("high", 50.0), 50.0, 100.0, "rollout")]
    r = simulate(_nodes(2), DOMAINS, jobs, _cfg(), 0.0, 3000.0, tick_s=10.0)
    # both replicas join at 0 together (no regroup); at 50 one is killed for high: the other regroups [50, 70] and works
    # alone to 150 (180 done), the killed one comes back at 150 and both regroup [150, 170]; 1820 left at 2 a second: 1080
    assert r["preemptions"] == 1 and r["jobs_finished"] == 2 and r["delay_quantiles_s"][100] == 0.0
    assert r["preempted_gpu_hours_lost"] == pytest.approx((8 * 20 + 16 * 20) / 3600)
    assert r["gpu_goodput"] == pytest.approx(8 * (2000 + 100) / 48000.0)
    assert r["gpu_utilisation"] == pytest.approx(8 * (1080 + 50 + 930 + 100) / 48000.0)


@pytest.mark.parametrize("notice", [True, False])
def test_the_last_replica_saves_on_notice_or_falls_back_to_its_last_save(notice):
    jobs = [SimJob(_run(), 0.0, 1000.0, "train"), SimJob(_other("high", 600.0), 600.0, 100.0, "rollout")]
    r = simulate(_nodes(1), DOMAINS, jobs, _cfg(notice=notice), 0.0, 3000.0, tick_s=10.0)
    assert r["preemptions"] == 1 and r["jobs_finished"] == 2
    if notice:  # told at 600, it saves its 600 replica-s until 650; high runs [650, 750], the 1400 left [750, 2150]
        assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 50.0 / 3600)
        assert r["gpu_utilisation"] == pytest.approx(8 * (650 + 100 + 1400) / 24000.0)
        assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(150.0), "1": pytest.approx(50.0)}
    else:  # killed at 600 before its first save (every 1800 s of the run's pace): all 600 lost; high [600, 700], the run [700, 2700]
        assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 600.0 / 3600)
        assert r["gpu_utilisation"] == pytest.approx(8 * (600 + 100 + 2000) / 24000.0)
        assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(100.0), "1": pytest.approx(0.0)}
    assert r["gpu_goodput"] == pytest.approx(8 * (2000 + 100) / 24000.0)


def test_a_run_that_finishes_withdraws_its_replicas_still_queued():
    busy = Job("busy", "b", (TRAINER,), 0, 0.0, "b/w", True, 0.0, 300.0)
    jobs = [SimJob(busy, 0.0, 500.0, "rollout"), SimJob(_run(), 0.0, 100.0, "train")]
    domains = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 8, 1.0), DomainSpec("b", 1.0, 0, 1.0, 0.0, 8, 1.0)]
    r = simulate(_nodes(2), domains, jobs, PRESETS["fifo"].model_copy(update={"split_elastic": True}), 0.0, 1000.0, tick_s=10.0)
    # one replica does the run's 200 replica-s alone by 200; its peer, still queued behind busy, is taken out
    assert r["jobs_finished"] == 2 and r["jobs_waiting_at_end"] == 0
    assert r["gpu_goodput"] == pytest.approx(8 * (500 + 200) / 16000.0) == r["gpu_utilisation"]


def test_a_replicated_replay_keeps_the_books_and_finishes_every_run():
    spec = WorkloadSpec(nodes=40, racks=2, domains=12, hours=8.0, warmup_hours=1.0, load=1.1, seed=5, replicated_training=True)
    nodes, domains, jobs = make_workload(spec)
    sim = Simulation(nodes, domains, jobs, PRESETS["longhaul"], 3600.0, 8 * 3600.0)
    r = sim.run()
    assert r["replicas_regroup_gpu_hours"] > 0 and r["preemptions"] > 0 and sum(rr.finished for rr in sim.runs.values()) >= 5
    for batch, rr in sim.runs.items():
        assert rr.work >= -1e-6 and rr.done >= rr.saved - 1e-6
        if rr.finished:  # all its work done, nothing of it left queued or running
            assert rr.done == pytest.approx(rr.shards * sim.jobs[sim.parts[batch][0]].work_s)
            assert not any(p in sim.placer.jobs or p in sim.placer.running for p in sim.parts[batch])
    check_books(sim.placer, len(nodes))


def test_the_workload_marks_training_runs_as_replicas_and_nothing_else_changes():
    spec = WorkloadSpec(nodes=40, racks=2, domains=10, hours=4.0, seed=1)
    _, domains, jobs = make_workload(dataclasses.replace(spec, replicated_training=True))
    _, _, gangs = make_workload(spec)  # the default: gangs
    ckpt = {d.name: d.checkpoint_gb for d in domains}
    assert [(j.job.id, j.work_s, j.job.units) for j in jobs] == [(j.job.id, j.work_s, j.job.units) for j in gangs]
    for j, g in zip(jobs, gangs):
        if j.kind == "train":
            assert j.job.elastic and j.job.replica == Replica(30.0, notice_save_s("train", ckpt[j.job.domain], 1))
            assert not g.job.elastic and g.job.replica is None
        assert j.job.notice_save_s == g.job.notice_save_s


def test_the_last_replica_is_priced_by_its_runs_saves_not_its_own_clock():
    # one node: one replica works alone from 0; the run saves every 2 x 1800 replica-s, so at 1850 nothing is saved. The
    # replica reports that (Running.saved_at): killing it would lose 1850 s, so it is told and saves in 60 s
    jobs = [SimJob(_run(save_s=60.0), 0.0, 3000.0, "train"), SimJob(_other("high", 1850.0), 1850.0, 100.0, "rollout")]
    r = simulate(_nodes(1), DOMAINS, jobs, _cfg(reserve_after_s=None), 0.0, 20000.0, tick_s=10.0)
    assert r["preemptions"] == 1 and r["jobs_finished"] == 2
    assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 60.0 / 3600)
    assert r["gpu_goodput"] == pytest.approx(8 * (6000 + 100) / (8 * 20000.0))


def test_evicting_every_working_replica_of_a_run_tells_the_last_one():
    p = _working_run()
    p.submit(Job("wide", "b", (TRAINER, TRAINER), 1, 0.0, "b/w", False, 600.0, 300.0), 600.0)
    # each replica has a peer, but the peer goes too: one is killed, the other holds the only copy and saves
    assert [(w, r.job.id) for w, r in p.schedule(600.0)] == [("preempt", "train#1"), ("notice", "train#0")]


def test_replicas_rejoining_an_idle_run_form_their_group_at_no_cost():
    wide = Job("wide", "b", (TRAINER, TRAINER), 1, 0.0, "b/w", True, 100.0, 300.0)
    jobs = [SimJob(_run(), 0.0, 1000.0, "train"), SimJob(wide, 100.0, 5.0, "rollout")]
    r = simulate(_nodes(2), DOMAINS, jobs, _cfg(reserve_after_s=None), 0.0, 5000.0, tick_s=10.0)
    assert r["preemptions"] == 2 and r["replicas_regroup_gpu_hours"] == 0.0  # no stale regroup from before they left


def test_a_rollback_loses_exactly_the_work_since_the_runs_last_save():
    # notice off; both replicas work from 0 (1800 replica-s by 900); h1 kills one at 900 (its peer regroups to 920, then
    # works alone: 80 more by 1000); h2 kills the last at 1000: the 1880 replica-s since the start are lost (no save yet,
    # every 3600), 8 x 1880 GPU-s, with the 160 GPU-s of the regroup
    pinned = [Job(j, "b", (TRAINER,), 1, 0.0, "b/w", False, t, 300.0) for j, t in (("h1", 900.0), ("h2", 1000.0))]
    jobs = [SimJob(_run(), 0.0, 5000.0, "train")] + [SimJob(j, j.submitted, 9000.0, "rollout") for j in pinned]
    r = simulate(_nodes(2), DOMAINS, jobs, _cfg(notice=False, reserve_after_s=None), 0.0, 2000.0, tick_s=10.0)
    assert r["preempted_gpu_hours_lost"] == pytest.approx((8 * 1880 + 160) / 3600)
    assert r["gpu_goodput"] == pytest.approx(8 * (1100 + 1000) / (16 * 2000.0))
