"""The cluster simulator: exact figures on hand-made workloads, the fairness reference, sanity
and determinism of the synthetic workload for a seed."""

import dataclasses
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.sim.cluster_sim import REMOTE_GBPS, Simulation, simulate
from benchmarks.sim.fairness import entitlement
from benchmarks.sim.workload import DomainSpec, SimJob, WorkloadSpec, make_workload
from longhaul.placement.cluster import Node, Resources
from longhaul.placement.entitlement import water_fill
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.placer import PRESETS

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _domain(name: str, weight: float = 1.0, priority: int = 0) -> DomainSpec:
    return DomainSpec(name, weight, priority, 1.0, 0.0, 8, 1.0)


def _sim_job(jid: str, at: float, work: float, gpus: int = 8, domain: str = "a", priority: int = 0, ckpt: float = 0.0) -> SimJob:
    job = Job(jid, domain, (WorkUnit("rollout", Resources(cpus=1, mem_gb=1, gpus=gpus)),), priority, ckpt, f"{domain}/w", True, at)
    return SimJob(job, at, work, "rollout")


def test_one_job_gives_exact_figures():
    jobs = [_sim_job("j", 0.0, 100.0, gpus=2, ckpt=20.0)]
    sim = Simulation([Node("n", NODE, "r")], [_domain("a")], jobs, PRESETS["longhaul"], 0.0, 1000.0)
    r = sim.run()
    load = 20.0 / REMOTE_GBPS  # nothing cached anywhere yet
    assert r["gpu_utilisation"] == pytest.approx(2 * (100.0 + load) / (8 * 1000.0))
    assert r["gpu_goodput"] == pytest.approx(2 * 100.0 / (8 * 1000.0))
    assert r["delay_p99_s"] == 0.0 and r["jobs_finished"] == 1 and r["fairness_error"] == 0.0


def test_a_second_whole_node_job_waits_for_the_first():
    jobs = [_sim_job("a", 0.0, 100.0), _sim_job("b", 5.0, 50.0)]
    r = simulate([Node("n", NODE, "r")], [_domain("a")], jobs, PRESETS["fifo"], 0.0, 1000.0, tick_s=10.0)
    # a runs [0, 100]; b arrives at 5, and the pass at the tick of a's finish (100) starts it
    assert r["delay_quantiles_s"][0] == 0.0 and r["delay_quantiles_s"][100] == pytest.approx(95.0)
    assert r["gpu_utilisation"] == pytest.approx(150.0 / 1000.0) and r["jobs_finished"] == 2


def test_preemption_loses_work_since_the_last_checkpoint():
    jobs = [_sim_job("low", 0.0, 1000.0, priority=0), _sim_job("high", 50.0, 100.0, domain="b", priority=1)]
    cfg = PRESETS["longhaul"].model_copy(update={"preempt_after_s": 60.0, "min_class_share": 0.0})  # strict: no floor keeps "low"
    r = simulate([Node("n", NODE, "r")], [_domain("a"), _domain("b", priority=1)], jobs, cfg, 0.0, 2000.0, tick_s=10.0)
    # high waits 60 s (t=110), low loses its 110 s (rollouts save every 300 s), high runs [110, 210], low restarts
    assert r["preemptions"] == 1
    assert r["preempted_gpu_hours_lost"] == pytest.approx(8 * 110.0 / 3600)
    assert r["delay_p99_by_priority_s"] == {"0": pytest.approx(100.0), "1": pytest.approx(60.0)}
    assert r["jobs_finished"] == 2 and r["gpu_goodput"] == pytest.approx(8 * 1100.0 / (8 * 2000.0))


@settings(max_examples=200, deadline=None)
@given(cap=st.floats(0, 100), demand=st.lists(st.floats(0, 50), min_size=1, max_size=8), weights=st.data())
def test_water_fill_is_weighted_max_min_fair(cap, demand, weights):
    names = [f"d{i}" for i in range(len(demand))]
    w = {n: weights.draw(st.floats(0.1, 10)) for n in names}
    d = dict(zip(names, demand))
    got = water_fill(cap, d, w)
    assert sum(got.values()) == pytest.approx(min(cap, sum(demand)), abs=1e-6)
    assert all(-1e-9 <= got[n] <= d[n] + 1e-9 for n in names)
    short = [n for n in names if got[n] < d[n] - 1e-6]  # not fully served: they share the same level per weight
    if short:
        level = got[short[0]] / w[short[0]]
        assert all(got[n] / w[n] == pytest.approx(level, rel=1e-6) for n in short)
        assert all(got[n] / w[n] <= level + 1e-6 for n in names)


def test_entitlement_serves_priorities_first():
    got = entitlement(10.0, {"hi": 4.0, "a": 10.0, "b": 10.0}, {"hi": 1.0, "a": 1.0, "b": 2.0}, {"hi": 1, "a": 0, "b": 0})
    assert got == pytest.approx({"hi": 4.0, "a": 2.0, "b": 4.0})


@pytest.fixture(scope="module")
def small():
    spec = WorkloadSpec(nodes=60, racks=3, domains=20, hours=6.0, warmup_hours=1.0, seed=3)
    return spec, make_workload(spec)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_synthetic_workload_is_sane_and_deterministic(small, preset):
    spec, (nodes, domains, jobs) = small
    assert len(nodes) == 60 and len({n.rack for n in nodes}) == 3 and len(domains) == 20 and len(jobs) > 100
    sim = Simulation(nodes, domains, jobs, PRESETS[preset], spec.warmup_hours * 3600, spec.hours * 3600)
    r = sim.run(progress=lambda now: sim.cluster.check())  # the books balance after every pass
    again = simulate(nodes, domains, jobs, PRESETS[preset], spec.warmup_hours * 3600, spec.hours * 3600)
    assert r == again
    assert 0.0 < r["gpu_goodput"] <= r["gpu_utilisation"] <= 1.0 and 0.0 < r["cpu_utilisation"] <= 1.0
    assert r["delay_quantiles_s"] == sorted(r["delay_quantiles_s"]) and r["delay_quantiles_s"][0] >= 0.0
    assert 0.0 <= r["fairness_error"] <= 2.0 and len(r["gpu_utilisation_hourly"]) == 5
    arrived = sum(1 for j in jobs if j.arrival <= spec.hours * 3600)
    alive = [*sim.placer.running, *sim.placer.jobs, *sim.placer.stopping]
    assert sim.placer.queued() == len(sim.placer.jobs) and len(alive) == len(set(alive))
    assert r["jobs_finished"] + len(sim.jobs_of(alive)) == arrived  # no job lost (one run as shards is done with its last)
    if preset != "longhaul":
        assert r["preemptions"] == 0


def test_workload_is_a_function_of_its_seed():
    a = make_workload(WorkloadSpec(nodes=40, racks=2, domains=10, hours=2.0, seed=1))
    b = make_workload(WorkloadSpec(nodes=40, racks=2, domains=10, hours=2.0, seed=1))
    c = make_workload(WorkloadSpec(nodes=40, racks=2, domains=10, hours=2.0, seed=2))
    key = lambda w: [(j.job.id, j.arrival, j.work_s, j.job.domain, len(j.job.units)) for j in w[2]]
    assert key(a) == key(b) and key(a) != key(c)


def test_notice_save_what_if_changes_only_the_saves():
    spec = WorkloadSpec(nodes=40, racks=2, domains=10, hours=2.0, seed=1)
    base = make_workload(spec)[2]
    free = make_workload(dataclasses.replace(spec, notice_save_s=1.0))[2]
    key = lambda js: [(j.job.id, j.arrival, j.work_s, j.job.domain, j.job.units, j.job.checkpoint_every_s) for j in js]
    assert key(free) == key(base)
    assert {j.job.notice_save_s for j in free} == {1.0}
    assert all((j.job.notice_save_s is not None) == (j.kind == "train") for j in base)  # as modelled: training runs save on notice


def test_two_backlogged_domains_at_1_to_3_converge_to_their_weights():
    # "a" runs whole-node hour-long gangs, "b" quarter-node 15-minute jobs; both always backlogged
    jobs = [_sim_job(f"a{k}", 0.0, 3600.0, 8, "a") for k in range(40)] + [_sim_job(f"b{k}", 0.0, 900.0, 2, "b") for k in range(1200)]
    for sj in jobs:
        sj.job.checkpoint_every_s = 300.0
    sim = Simulation([Node(f"n{i}", NODE, "r") for i in range(2)], [_domain("a", 1.0), _domain("b", 3.0)], jobs,
                     PRESETS["longhaul"], 3600.0, 25 * 3600.0)
    r = sim.run()
    used = {d: sum(h.get(d, 0.0) for h in sim.ledgers["gpu"].used.values()) for d in "ab"}
    share = used["a"] / sum(used.values())
    assert abs(share - 0.25) <= 0.03, f"weight-1 domain got {share:.3f} of the GPUs, want 0.25 +- 0.03"
    assert r["fairness_error"] <= 0.05


def test_a_wait_that_ends_in_the_window_is_not_unmet_demand():
    # a holds the node for 3650 s; b's 5-minute job waits that long behind it (FIFO), then runs
    jobs = [_sim_job("a", 0.0, 3650.0, domain="a"), _sim_job("b", 0.0, 300.0, domain="b")]
    r = simulate([Node("n", NODE, "r")], [_domain("a"), _domain("b")], jobs, PRESETS["fifo"], 0.0, 6 * 3600.0, tick_s=10.0)
    assert r["delay_quantiles_s"][100] == pytest.approx(3650.0)
    # both got all the work they asked for in the 6 h window: no share was short, however late
    assert r["fairness_error"] == pytest.approx(0.0, abs=1e-12)
    # by hour: b waited through the first hour, so it asked 300 s more than it got there (entitled to
    # 300 of the 3600 used: a over by 300, b under by 300), and got it all in the second
    assert r["fairness_hourly"][0] == pytest.approx(600 / 3600) and r["fairness_hourly"][1] == pytest.approx(0.0, abs=1e-12)
    # the earlier measure counts every second waited as demand: b asks 300 used + 3600 waited,
    # and equal weights split the 3950 used 1975 / 1975, though b had only 300 s of work
    assert r["fairness_error_waits"] == pytest.approx((3650 - 1975 + 1975 - 300) / 3950)
    # capped: b's wait counts 300 s (its work), so it is below the line: entitled to 600, a to 3350
    assert r["fairness_error_capped"] == pytest.approx((3650 - 3350 + 600 - 300) / 3950)


def test_work_still_waiting_when_a_window_closes_is_unmet_demand():
    # a holds the node 7 h: b's 5-minute job waits through the first 6 h window and runs in the second
    jobs = [_sim_job("a", 0.0, 7 * 3600.0, domain="a"), _sim_job("b", 0.0, 300.0, domain="b")]
    r = simulate([Node("n", NODE, "r")], [_domain("a"), _domain("b")], jobs, PRESETS["fifo"], 0.0, 12 * 3600.0, tick_s=10.0)
    # window 1: a used 21600 s, b asked its 300 s of work and got none (entitled 300, a 21300);
    # window 2: a 3600 + b 300 used, nothing left waiting
    assert r["fairness_error_worst_window"] == pytest.approx(600 / 21600)
    assert r["fairness_error"] == pytest.approx(600 / (21600 + 3900))


def test_a_job_that_starts_as_the_window_closes_waited_through_it():
    # a ends at 3600 s and b starts at that pass: b got nothing in the first hour
    jobs = [_sim_job("a", 0.0, 3600.0, domain="a"), _sim_job("b", 0.0, 300.0, domain="b")]
    r = simulate([Node("n", NODE, "r")], [_domain("a"), _domain("b")], jobs, PRESETS["fifo"], 0.0, 6 * 3600.0, tick_s=10.0)
    assert r["fairness_hourly"][0] == pytest.approx(600 / 3600)


def test_a_job_running_at_the_close_is_short_by_its_wait_in_the_window():
    # b (10 h of work) waits 3000 s behind a, then runs: in the first hour it could have used all 3600 s
    jobs = [_sim_job("a", 0.0, 3000.0, domain="a"), _sim_job("b", 0.0, 36000.0, domain="b")]
    r = simulate([Node("n", NODE, "r")], [_domain("a"), _domain("b")], jobs, PRESETS["fifo"], 0.0, 2 * 3600.0, tick_s=10.0)
    # used a 3000, b 600; b asked 600 + 3000: equal weights entitle each to 1800
    assert r["fairness_hourly"][0] == pytest.approx((1200 + 1200) / 3600)


def test_every_wait_of_a_preempted_job_in_the_window_counts():
    # b waits 3000 s, runs 360 s, is evicted by a priority-1 job and waits again at the close
    cfg = PRESETS["longhaul"].model_copy(update={"preempt_after_s": 60.0, "min_class_share": 0.0})
    jobs = [_sim_job("a", 0.0, 3000.0, domain="a"), _sim_job("b", 0.0, 36000.0, domain="b"),
            _sim_job("c", 3300.0, 36000.0, domain="c", priority=1)]
    sim = Simulation([Node("n", NODE, "r")], [_domain("a"), _domain("b"), _domain("c", priority=1)], jobs, cfg, 0.0, 2 * 3600.0, tick_s=10.0)
    r = sim.run()
    assert r["preemptions"] == 1
    # priority 0 used a 3000, b 360 and asked 3000 + 240 more: equal weights entitle each to 1680
    assert r["fairness_hourly"][0] == pytest.approx((1320 + 1320) / 3600)


def test_jobs_that_only_wait_for_the_next_pass_are_no_backlog():
    # 5-second jobs on idle nodes, each arriving just after a pass: they wait under 10 s, never for room
    jobs = [_sim_job(f"j{k}", 10 * k + 0.05, 5.0, gpus=1) for k in range(720)]
    r = simulate([Node(f"n{i}", NODE, "r") for i in range(2)], [_domain("a")], jobs, PRESETS["fifo"], 0.0, 7200.0, tick_s=10.0)
    assert r["backlogged_hours"] == 0 and r["gpu_utilisation_backlogged"] is None and r["backlogged_hourly"] == [False, False]
    # a node held for two hours while a second whole-node job waits: both hours backlogged, fully allocated
    r = simulate([Node("n", NODE, "r")], [_domain("a")], [_sim_job("a", 0.0, 7200.0), _sim_job("b", 1.0, 60.0)], PRESETS["fifo"],
                 0.0, 7200.0, tick_s=10.0)
    assert r["backlogged_hourly"] == [True, True] and r["gpu_utilisation_backlogged"] == pytest.approx(1.0)


def test_a_placer_blind_to_the_weights_is_measured_unfair():
    # the 1:3 workload below, through FIFO (which ignores the weights): "a" submitted first takes the nodes
    jobs = [_sim_job(f"a{k}", 0.0, 3600.0, 8, "a") for k in range(40)] + [_sim_job(f"b{k}", 0.0, 900.0, 2, "b") for k in range(1200)]
    r = simulate([Node(f"n{i}", NODE, "r") for i in range(2)], [_domain("a", 1.0), _domain("b", 3.0)], jobs, PRESETS["fifo"],
                 3600.0, 25 * 3600.0)
    assert r["fairness_error"] > 0.5  # both backlogged throughout: entitled 1:3, used all-a for 20 h
