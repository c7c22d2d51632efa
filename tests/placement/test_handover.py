"""Pre-emption with notice: a victim that saves on notice keeps its nodes while it saves, loses
only the save, and the head that evicted it starts after; the placer tells it only when that
loses less than killing it; the simulator counts exactly that."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.sim.cluster_sim import Simulation, simulate
from benchmarks.sim.workload import DomainSpec, SimJob, WorkloadSpec, make_workload, notice_save_s
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.placer import PRESETS, Placer, PlacerConfig
from tests.placement.placement_helpers import check_books, parts, run_by_hand

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _job(jid: str, gpus: int, domain: str = "d", priority: int = 0, at: float = 0.0, **kw) -> Job:
    return Job(jid, domain, (WorkUnit("trainer", Resources(cpus=1, mem_gb=4, gpus=gpus)),), priority, submitted=at, **kw)


def _what(log) -> list[tuple[str, str]]:
    return [(what, r.job.id) for what, r in log]


def _placer(nodes: int = 1, notice: bool = True, **cfg) -> Placer:
    return Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(nodes)]),
                  PlacerConfig(preempt_after_s=0, reserve_after_s=None, notice=notice, **cfg))


def test_a_told_victim_keeps_its_gpus_while_it_saves_and_the_head_claims_the_rest():
    p = _placer()
    p.submit(_job("train", 4, notice_save_s=50.0, checkpoint_every_s=1800.0), 0.0)
    p.submit(_job("other", 4, checkpoint_every_s=1800.0, preemptible=False), 0.0)
    p.schedule(0.0)
    p.release("other", 10.0)
    p.submit(_job("urgent", 8, priority=1, at=100.0), 100.0)
    assert _what(p.schedule(100.0)) == [("notice", "train")]
    assert p.c.holdings["train"] == [(0, (1000, 4096, 4))]  # it still holds its GPUs: it is saving
    assert p.c.holdings["urgent"] == [(0, (0, 0, 4))]  # the head claims what it needs beyond the victim's: the 4 free GPUs
    assert "train" in p.stopping and "train" not in p.running and "urgent" in p.awaiting
    p.submit(_job("small", 1, domain="e", at=110.0), 110.0)
    assert p.schedule(140.0) == []  # nothing is free: the claim and the save hold the node; the head does not pre-empt again
    p.c.check()
    log = p.schedule(150.0)  # the save ended at 150: the victim goes back to its queue, the head takes the node whole
    assert _what(log) == [("preempt", "train"), ("start", "urgent")]
    assert p.c.holdings["urgent"] == [(0, (1000, 4096, 8))] and p.jobs.keys() == {"train", "small"}
    assert p.waiting_since["train"] == 150.0 and not p.stopping and not p.awaiting
    p.c.check()


def test_the_handover_alone_keeps_a_told_victims_nodes_until_its_save_ends():
    t = parts(Cluster([Node("n0", NODE, "r")]), PlacerConfig(notice=True, usage_half_life_s=None))
    s = t.state
    victim = run_by_hand(t, _job("train", 4, notice_save_s=50.0, checkpoint_every_s=1800.0), [0], 0.0)
    head = _job("urgent", 8, priority=1, at=100.0)
    t.books.enqueue(head, 100.0)
    assert t.handover.told(victim, 100.0)  # its 50 s save loses less than the 100 s since it started
    log = []
    t.handover.tell([victim], head, [0], 100.0, log)
    assert log == [("notice", victim)] and s.stopping == {"train": (victim, 150.0)} and not s.running
    assert s.awaiting == {"urgent": ([0], 150.0, ["train"])} and s.c.holdings["urgent"] == [(0, (0, 0, 4))]  # claims the free half
    assert s.c.holdings["train"] == [(0, (1000, 4096, 4))] and s.level("d", 100.0) == 0.0  # holds its GPUs, no longer its domain's use
    t.handover.hand_over(149.0, log)
    assert len(log) == 1  # still saving
    t.handover.hand_over(150.0, log)
    assert [(what, r.job.id) for what, r in log[1:]] == [("preempt", "train"), ("start", "urgent")]
    assert s.jobs.keys() == {"train"} and s.waiting_since["train"] == 150.0 and not s.stopping and not s.awaiting
    assert s.c.holdings["urgent"] == [(0, (1000, 4096, 8))]
    s.c.check()


def test_the_cost_of_a_told_victim_is_its_save_and_it_goes_first():
    p = _placer(nodes=1)
    p.submit(_job("rollout", 4, checkpoint_every_s=300.0), 0.0)
    p.submit(_job("train", 4, notice_save_s=100.0, checkpoint_every_s=1800.0), 0.0)
    p.schedule(0.0)
    # at 250 s the rollout would lose 250 s (it saves at 300), the training run its 100 s save, not 250 s
    assert p.preemption.unsaved_s(p.running["rollout"], 250.0) == pytest.approx(250.0)
    assert p.preemption.unsaved_s(p.running["train"], 250.0) == pytest.approx(100.0)
    p.submit(_job("urgent", 4, priority=1, at=250.0), 250.0)
    assert _what(p.schedule(250.0)) == [("notice", "train")]


def test_a_victim_that_just_saved_or_is_still_loading_is_killed_not_told():
    p = _placer()
    p.submit(_job("train", 8, notice_save_s=100.0, checkpoint_every_s=300.0), 0.0)
    p.schedule(0.0)
    run = p.running["train"]
    run.working_from = 20.0  # loaded for 20 s: saves at 320, 620, ... s
    assert not p.handover.told(run, 10.0)  # still loading: nothing new to save
    assert p.preemption.unsaved_s(run, 10.0) == pytest.approx(10.0)
    assert not p.handover.told(run, 340.0) and p.preemption.unsaved_s(run, 340.0) == pytest.approx(20.0)  # saved 20 s ago: killing loses less
    assert p.handover.told(run, 500.0) and p.preemption.unsaved_s(run, 500.0) == pytest.approx(100.0)
    p.submit(_job("urgent", 8, priority=1, at=340.0), 340.0)
    assert _what(p.schedule(340.0)) == [("preempt", "train"), ("start", "urgent")]


def test_with_notice_off_every_victim_is_killed_at_once():
    p = _placer(notice=False)
    p.submit(_job("train", 8, notice_save_s=50.0, checkpoint_every_s=1800.0), 0.0)
    p.schedule(0.0)
    assert p.preemption.unsaved_s(p.running["train"], 100.0) == pytest.approx(100.0)
    p.submit(_job("urgent", 8, priority=1, at=100.0), 100.0)
    assert _what(p.schedule(100.0)) == [("preempt", "train"), ("start", "urgent")]


def test_fair_share_victims_told_to_save_are_capped_by_their_save():
    def victims(notice=True, **cfg):
        p = Placer(Cluster([Node("n", NODE, "r")]),
                   PlacerConfig(usage_half_life_s=None, preempt_after_s=0, fair_preempt_after_s=0, fair_preempt_max_loss_s=60.0,
                                reserve_after_s=None, notice=notice, **cfg), {"a": 1.0, "b": 1.0})
        for k in range(2):  # a holds the whole node, equal weights: b's first job may take half of it
            p.submit(_job(f"a{k}", 4, domain="a", notice_save_s=100.0 + k, checkpoint_every_s=1800.0), 0.0)
        p.schedule(0.0)
        p.submit(_job("b0", 4, domain="b", at=500.0), 500.0)
        return [(what, jid) for what, jid in _what(p.schedule(500.0)) if what in ("notice", "preempt")]
    assert victims() == []  # a 100 s save is over the 60 s cap
    assert victims(fair_preempt_max_save_s=120.0) == [("notice", "a0")]  # the shorter save goes first
    assert victims(fair_preempt_max_save_s=90.0) == []
    assert victims(fair_preempt_max_save_s=90.0, notice=False) == []  # killed, they would lose 500 s


def _sim_job(jid: str, at: float, work: float, domain: str, priority: int, **kw) -> SimJob:
    job = Job(jid, domain, (WorkUnit("trainer", Resources(cpus=1, mem_gb=1, gpus=8)),), priority, 0.0, f"{domain}/w", True, at,
              1800.0, **kw)
    return SimJob(job, at, work, "train")


@pytest.mark.parametrize("split", [True, False])
def test_the_simulator_runs_a_split_batch_as_its_workers_and_counts_it_once(split):
    worker = WorkUnit("rollout", Resources(cpus=1, mem_gb=1, gpus=4))
    batch = Job("batch", "a", (worker, worker), 0, 0.0, "a/w", True, 10.0, 300.0, elastic=True)
    jobs = [SimJob(Job("busy", "b", (worker,), 0, 0.0, "b/w", True, 0.0, 300.0), 0.0, 100.0, "rollout"), SimJob(batch, 10.0, 200.0, "rollout")]
    cfg = PRESETS["fifo"].model_copy(update={"split_elastic": split})
    domains = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 4, 1.0), DomainSpec("b", 1.0, 0, 1.0, 0.0, 4, 1.0)]
    # busy holds half the node for [0, 100]. Split: one worker of the batch runs [10, 210], the other [100, 300], each
    # 200 s on its half of the episodes; the batch waited as long as its later worker, 90 s. Whole: it waits for the
    # node and runs [100, 300]. Cut at 250 s, split has done 1800 of the 2000 GPU-seconds, whole 1600.
    r = simulate([Node("n", NODE, "r")], domains, jobs, cfg, 0.0, 250.0, tick_s=10.0)
    assert r["jobs_finished"] == 1 and r["jobs_in_window"] == 2 and r["jobs_waiting_at_end"] == 0  # the batch's second worker runs on
    assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(90.0)}
    assert r["gpu_goodput"] == pytest.approx(0.9 if split else 0.8) and r["gpu_utilisation"] == pytest.approx(r["gpu_goodput"])
    r = simulate([Node("n", NODE, "r")], domains, jobs, cfg, 0.0, 1000.0, tick_s=10.0)
    assert r["jobs_finished"] == 2 and r["gpu_goodput"] == pytest.approx(2000.0 / 8000.0)


@pytest.mark.parametrize("notice", [True, False])
def test_the_simulator_counts_a_told_victim_losing_only_its_save(notice):
    jobs = [_sim_job("low", 0.0, 1000.0, "a", 0, notice_save_s=50.0), _sim_job("high", 50.0, 100.0, "b", 1)]
    cfg = PRESETS["longhaul"].model_copy(update={"preempt_after_s": 60.0, "min_class_share": 0.0, "notice": notice})
    domains = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 8, 1.0), DomainSpec("b", 1.0, 1, 1.0, 0.0, 8, 1.0)]
    r = simulate([Node("n", NODE, "r")], domains, jobs, cfg, 0.0, 2000.0, tick_s=10.0)
    assert r["preemptions"] == 1 and r["jobs_finished"] == 2
    if notice:
        # high waits 60 s (t=110): low is told, keeps its 110 s of work and saves until 160 (its GPUs held);
        # high runs [160, 260], low the 890 s left [260, 1150]
        assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 50.0 / 3600)
        assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(100.0), "1": pytest.approx(110.0)}
        assert r["gpu_utilisation"] == pytest.approx(1150.0 / 2000.0)
    else:  # killed at 110: its 110 s are lost (it saves every 30 min); high runs [110, 210], low [210, 1210]
        assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 110.0 / 3600)
        assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(100.0), "1": pytest.approx(60.0)}
        assert r["gpu_utilisation"] == pytest.approx(1210.0 / 2000.0)
    assert r["gpu_goodput"] == pytest.approx(1100.0 / 2000.0)


def test_only_training_runs_save_on_notice_in_the_workload():
    _, domains, jobs = make_workload(WorkloadSpec(nodes=40, racks=2, domains=10, hours=4.0, seed=1))
    ckpt = {d.name: d.checkpoint_gb for d in domains}
    assert {j.kind for j in jobs} == {"rollout", "eval", "train"}
    for j in jobs:
        want = 60.0 + 3 * ckpt[j.job.domain] / (2.0 * len(j.job.units)) if j.kind == "train" else None  # each node writes its shard
        assert j.job.notice_save_s == want, j
    assert notice_save_s("train", 140.0) == pytest.approx(270.0) and notice_save_s("train", 140.0, 8) == pytest.approx(86.25)
    assert notice_save_s("rollout", 140.0) is None


def test_a_saturated_replay_with_told_victims_keeps_the_books_and_loses_no_job():
    spec = WorkloadSpec(nodes=40, racks=2, domains=12, hours=8.0, warmup_hours=1.0, load=1.1, seed=5)
    nodes, domains, jobs = make_workload(spec)
    cfg = PRESETS["longhaul"].model_copy(update={"notice": True, "fair_preempt_max_save_s": 300.0, "cpus_per_gpu": 6.0})
    sim = Simulation(nodes, domains, jobs, cfg, spec.warmup_hours * 3600, spec.hours * 3600)
    told = []
    notice = sim._on_notice
    sim._on_notice = lambda run, now: (told.append(run.job.id), notice(run, now))
    r = sim.run(progress=lambda now: sim.cluster.check())
    assert told and all(sim.jobs[j].kind == "train" for j in told)
    arrived = sum(1 for j in jobs if j.arrival <= spec.hours * 3600)
    assert r["jobs_finished"] + len(sim.jobs_of([*sim.placer.running, *sim.placer.jobs, *sim.placer.stopping])) == arrived
    assert all(v >= -1e-6 for v in sim.remaining.values())


# contended GPU nodes: gangs of 1-3 units of 1-8 GPUs, three priorities and domains, saves on notice or not; time passes after each op
submit_st = st.tuples(st.just("submit"), st.sampled_from([1, 2, 4, 8]), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2),
                      st.sampled_from([None, 0.0, 20.0, 45.0, 60.0, 200.0]), st.sampled_from([None, 100.0, 1000.0]))
notice_op_st = st.tuples(st.one_of(submit_st, st.tuples(st.just("release"), st.integers(0, 10**6))), st.floats(0, 90))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_nodes=st.integers(1, 4), ops=st.lists(notice_op_st, min_size=5, max_size=80),
       cfg=st.sampled_from([{}, {"hold_for_first": False}, {"entitled_preempt": False},
                            {"reserve_after_s": 0.0, "queue_order": "submitted"}]))
def test_notice_preemption_never_oversubscribes_a_node(n_nodes, ops, cfg):
    cfg = PRESETS["longhaul"].model_copy(update={"notice": True, "preempt_after_s": 0.0, "fair_preempt_after_s": 0.0,
                                                 "fair_preempt_max_loss_s": None, "min_class_share": 0.0, **cfg})
    p = Placer(Cluster([Node(f"n{i}", NODE, f"r{i % 2}") for i in range(n_nodes)]), cfg, {"d0": 1.0, "d1": 2.0, "d2": 4.0})
    now, n, told = 0.0, 0, set()
    for (op, *arg), dt in ops:
        if op == "submit":
            gpus, units, prio, dom, save, every = arg
            p.submit(Job(f"j{n}", f"d{dom}", (WorkUnit("w", Resources(cpus=1, mem_gb=4, gpus=gpus)),) * units, prio, submitted=now,
                         checkpoint_every_s=every, notice_save_s=save), now)
            n += 1
        elif p.running:
            p.release(sorted(p.running)[arg[0] % len(p.running)], now)
        for what, run in p.schedule(now):
            jid = run.job.id
            if what == "notice":
                assert jid in p.stopping and p.stopping[jid][1] == now + run.job.notice_save_s
                told.add(jid)
            elif what == "preempt" and jid in told:  # released once its save has ended
                told.discard(jid)
                assert jid not in p.stopping and (jid in p.jobs or jid in p.running)  # queued, or restarted in this pass
        check_books(p, n_nodes)
        now += dt


def test_a_head_claims_the_room_of_a_victim_that_saved_before_the_others():
    p = _placer()
    p.submit(_job("quick", 4, notice_save_s=20.0, checkpoint_every_s=1800.0), 0.0)
    p.submit(_job("slow", 4, notice_save_s=80.0, checkpoint_every_s=1800.0), 0.0)
    p.schedule(0.0)
    p.submit(_job("urgent", 8, priority=1, at=100.0), 100.0)
    assert sorted(_what(p.schedule(100.0))) == [("notice", "quick"), ("notice", "slow")]
    assert "urgent" not in p.c.holdings  # the victims hold the whole node: nothing to claim yet
    p.submit(_job("small", 4, domain="e", at=110.0), 110.0)
    assert _what(p.schedule(120.0)) == [("preempt", "quick")]  # quick has saved; its room goes to the head, not to "small"
    assert p.c.holdings["urgent"] == [(0, (0, 0, 4))] and p.c.free[0][2] == 0
    assert _what(p.schedule(180.0)) == [("preempt", "slow"), ("start", "urgent")]
    p.c.check()


@pytest.mark.parametrize("notice", [True, False])
def test_only_kills_count_against_max_preemptions(notice):
    # a told victim keeps its work, so telling it does not use up its `max_preemptions`; killing it does
    p = _placer(notice=notice, max_preemptions=1)
    p.submit(_job("train", 8, notice_save_s=50.0, checkpoint_every_s=1800.0), 0.0)
    p.schedule(0.0)
    p.submit(_job("urgent0", 8, priority=1, at=100.0), 100.0)
    first = _what(p.schedule(100.0))
    assert first == ([("notice", "train")] if notice else [("preempt", "train"), ("start", "urgent0")])
    if notice:
        assert _what(p.schedule(150.0)) == [("preempt", "train"), ("start", "urgent0")]  # saved: handed over
    p.release("urgent0", 160.0)
    assert _what(p.schedule(160.0)) == [("start", "train")]
    p.submit(_job("urgent1", 8, priority=1, at=400.0), 400.0)
    second = _what(p.schedule(400.0))
    assert second == ([("notice", "train")] if notice else [])  # killed once: no longer evictable
    assert p.evictions["train"] == (2 if notice else 1) and p.kills["train"] == (0 if notice else 1)


def test_the_simulator_runs_on_while_a_told_victim_saves_after_the_last_event():
    # g is told at 1000 and saves until 1500; its voided finish (1100) is the last event: the replay still ticks
    # through the save, hands g back and finishes both (it crashed on ceil(inf) once nothing but a save was left)
    jobs = [_sim_job("g", 0.0, 1100.0, "a", 0, notice_save_s=500.0), _sim_job("h", 1000.0, 100.0, "b", 1)]
    cfg = PRESETS["longhaul"].model_copy(update={"preempt_after_s": 0.0, "min_class_share": 0.0, "reserve_after_s": None})
    domains = [DomainSpec("a", 1.0, 0, 1.0, 0.0, 8, 1.0), DomainSpec("b", 1.0, 1, 1.0, 0.0, 8, 1.0)]
    r = simulate([Node("n", NODE, "r")], domains, jobs, cfg, 0.0, 3000.0, tick_s=10.0)
    assert r["jobs_finished"] == 2 and r["preemptions"] == 1
    assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 500.0 / 3600)
    assert r["gpu_goodput"] == pytest.approx(8 * (1100 + 100) / 24000.0)
