"""The placer: never oversubscribes under random arrivals and releases (hypothesis), pre-empts
exactly as specified, drains nodes for a starving gang, shares by weight."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, Replica, WorkUnit
from longhaul.placement.placer import PRESETS, Placer, PlacerConfig
from tests.placement.placement_helpers import check_books

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _job(jid: str, gpus: int, units: int = 1, domain: str = "d", priority: int = 0, at: float = 0.0, **kw) -> Job:
    return Job(jid, domain, (WorkUnit("rollout", Resources(cpus=1, mem_gb=4, gpus=gpus)),) * units, priority, submitted=at, **kw)


def _placer(nodes: int = 1, racks: int = 1, **cfg) -> Placer:
    c = Cluster([Node(f"n{i}", NODE, f"rack{i % racks}") for i in range(nodes)])
    return Placer(c, PlacerConfig(**cfg))


def _started(log) -> list[str]:
    return [r.job.id for what, r in log if what == "start"]


def _preempted(log) -> list[str]:
    return [r.job.id for what, r in log if what == "preempt"]


units_st = st.tuples(st.floats(0, 12).map(lambda x: round(x, 3)), st.integers(0, 48), st.integers(0, 8))
job_st = st.tuples(st.lists(units_st, min_size=1, max_size=4), st.integers(0, 2), st.floats(0, 200), st.booleans(),
                   st.sampled_from([None, 0.0, 40.0, 500.0]),  # its save on notice (handover.py)
                   st.sampled_from([None, 30.0, 300.0]),  # how often it saves (victims that keep progress)
                   st.sampled_from(["gang", "elastic", "replicas"]))  # with split_elastic, the last two queue one shard a unit
op_st = st.one_of(st.tuples(st.just("submit"), job_st), st.tuples(st.just("release"), st.integers(0, 10**6)),
                  st.tuples(st.just("tick"), st.floats(0, 400)), st.tuples(st.just("withdraw"), st.integers(0, 10**6)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caps=st.lists(st.tuples(st.integers(1, 32), st.integers(8, 128), st.integers(0, 8), st.integers(0, 2)), min_size=1, max_size=6),
       ops=st.lists(op_st, min_size=1, max_size=60), preset=st.sampled_from(sorted(PRESETS)),
       reserve=st.sampled_from([None, 0.0, 100.0]), hold=st.booleans(), entitled=st.booleans(), instant=st.booleans(),
       split=st.booleans())
def test_no_node_is_ever_oversubscribed(caps, ops, preset, reserve, hold, entitled, instant, split):
    nodes = [Node(f"n{i}", Resources(c, m, g), f"rack{r}") for i, (c, m, g, r) in enumerate(caps)]
    cfg = PRESETS[preset].model_copy(update={"reserve_after_s": reserve, "preempt_after_s": 30.0, "hold_for_first": hold,
                                             "entitled_preempt": entitled, "notice": True, "instant_first": instant,
                                             "split_elastic": split}
                                       if preset == "longhaul" else {"split_elastic": split})
    placer = Placer(Cluster(nodes), cfg, {"d0": 1.0, "d1": 3.0})
    now, n = 0.0, 0
    for op, arg in ops:
        if op == "submit":
            units, prio, ckpt, preemptible, notice, every, kind = arg
            replica = Replica(10.0, notice) if kind == "replicas" else None
            job = Job(f"j{n}", f"d{n % 2}", tuple(WorkUnit("w", Resources(*u)) for u in units), prio, ckpt, f"c{n % 3}", preemptible, now,
                      checkpoint_every_s=every, notice_save_s=notice, elastic=kind != "gang", replica=replica)
            parts = placer.submit(job, now)
            assert len(parts) == (len(units) if split and kind != "gang" else 1) and all(q.id in placer.jobs for q in parts)
            n += 1
        elif op == "release" and placer.running:
            placer.release(sorted(placer.running)[arg % len(placer.running)])
        elif op == "withdraw" and placer.jobs:  # a replica whose run finished (the head of a handover, too)
            placer.withdraw(sorted(placer.jobs)[arg % len(placer.jobs)])
        else:
            now += arg
        for what, run in placer.schedule(now):
            if what == "preempt":  # back in its queue (or already restarted elsewhere in the same pass)
                assert (run.job.id in placer.jobs or run.job.id in placer.running) and run.job.preemptible
            if what == "notice":  # saving: it holds its resources, out of the queue, not running
                assert run.job.id in placer.stopping and run.job.notice_save_s is not None
        check_books(placer, len(nodes))
        assert placer.replicas_running == {b: {j for j, r in placer.running.items() if r.job.batch == b and r.job.replica}
                                           for b in {r.job.batch for r in placer.running.values() if r.job.replica and r.job.batch}}


def test_higher_priority_preempts_after_its_grace_period():
    p = _placer(preempt_after_s=60)
    p.submit(_job("low", 8, priority=0), 0.0)
    assert _started(p.schedule(0.0)) == ["low"]
    p.submit(_job("high", 8, priority=1, at=10.0), 10.0)
    assert p.schedule(30.0) == []  # waited 20 s < 60 s: natural departures get a chance first
    log = p.schedule(71.0)
    assert _preempted(log) == ["low"] and _started(log) == ["high"]
    assert p.jobs == {"low": p.jobs["low"]} and p.waiting_since["low"] == 71.0  # back in its queue
    assert p.preemptions == 1


def test_equal_priority_and_non_preemptible_jobs_are_never_evicted():
    p = _placer(nodes=2, preempt_after_s=0)
    p.submit(_job("peer", 8, priority=1), 0.0)
    p.submit(_job("pinned", 8, priority=0, preemptible=False), 0.0)
    assert sorted(_started(p.schedule(0.0))) == ["peer", "pinned"]
    p.submit(_job("waiting", 8, priority=1), 1.0)
    assert p.schedule(100.0) == [] and p.preemptions == 0


def test_victims_are_lowest_priority_then_least_work_lost():
    p = _placer(nodes=1, preempt_after_s=0)
    p.submit(_job("p1-old", 2, priority=1), 0.0)
    p.submit(_job("p0-old", 2, priority=0), 0.0)
    assert len(_started(p.schedule(0.0))) == 2
    p.submit(_job("p0-young", 2, priority=0), 50.0)
    p.submit(_job("p0-young2", 2, priority=0), 50.0)
    assert len(_started(p.schedule(50.0))) == 2  # the node is full: 4 x 2 GPUs
    p.submit(_job("urgent", 4, priority=2), 60.0)
    log = p.schedule(60.0)
    # two of the three priority-0 jobs go; the old one has the most work to lose, so it stays
    assert sorted(_preempted(log)) == ["p0-young", "p0-young2"] and _started(log) == ["urgent"]
    assert "p1-old" in p.running and "p0-old" in p.running


def test_preemption_happens_only_if_it_makes_the_job_fit():
    p = _placer(nodes=1, preempt_after_s=0)
    p.submit(_job("low", 4, priority=0), 0.0)
    p.submit(_job("mid", 4, priority=1), 0.0)
    p.schedule(0.0)
    p.submit(_job("big", 8, priority=1), 1.0)  # would need mid's GPUs too, which it may not take
    assert p.schedule(2.0) == [] and "low" in p.running


def test_a_starving_gang_gets_nodes_drained_for_it():
    def run(reserve_after_s):
        p = _placer(nodes=2, racks=1, reserve_after_s=reserve_after_s, preempt=False)
        p.submit(_job("s-first", 4), 0.0)
        p.schedule(0.0)
        p.submit(_job("gang", 8, units=2), 0.0)  # needs both nodes whole
        started_gang_at = None
        t, k = 0.0, 0
        while t < 2000 and started_gang_at is None:
            for _ in range(2):  # small jobs keep arriving and always fit in what frees up
                p.submit(_job(f"s{k}", 4, at=t), t)
                k += 1
            for what, r in p.schedule(t):
                if r.job.id == "gang":
                    started_gang_at = t
            for jid, r in list(p.running.items()):
                if jid != "gang" and t - r.started >= 30:
                    p.release(jid)
            t += 10.0
        return started_gang_at
    assert run(None) is None  # plain backfill starves it
    started = run(100.0)
    assert started is not None and 100.0 <= started <= 200.0


def test_fair_share_follows_weights_among_backlogged_domains():
    c = Cluster([Node(f"n{i}", NODE, "rack0") for i in range(4)])
    p = Placer(c, PlacerConfig(), {"a": 1.0, "b": 3.0})
    for k in range(40):
        p.submit(_job(f"a{k}", 1, domain="a"), 0.0)
        p.submit(_job(f"b{k}", 1, domain="b"), 0.0)
    p.schedule(0.0)
    running = [jid[0] for jid in p.running]
    assert len(running) == 32  # 4 nodes x 8 GPUs, one GPU a job
    assert (running.count("a"), running.count("b")) == (8, 24)


def test_fifo_is_strict_and_backfill_overtakes():
    for preset, expect in (("fifo", ["first"]), ("fifo_backfill", ["first", "small"])):
        p = Placer(Cluster([Node("n0", NODE, "r")]), PRESETS[preset])
        p.submit(_job("first", 6, at=0.0), 0.0)
        p.submit(_job("big", 8, at=1.0), 1.0)
        p.submit(_job("small", 2, at=2.0), 2.0)
        assert _started(p.schedule(2.0)) == expect, preset


def test_submitting_a_job_twice_is_refused():
    p = _placer()
    p.submit(_job("a", 1), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        p.submit(_job("a", 1), 0.0)


def test_a_job_evicted_max_preemptions_times_is_not_evicted_again():
    p = _placer(preempt_after_s=0, max_preemptions=2)
    p.submit(_job("low", 8, priority=0), 0.0)
    p.schedule(0.0)
    for k in range(3):
        p.submit(_job(f"high{k}", 8, priority=1), 1.0 + k)
        log = p.schedule(1.0 + k)
        assert _preempted(log) == (["low"] if k < 2 else []), k
        if k < 2:  # high finishes, low restarts
            p.release(f"high{k}")
            assert _started(p.schedule(1.5 + k)) == ["low"]
    assert p.evictions["low"] == 2 and "low" in p.running


def test_the_victim_that_saved_most_recently_goes_first():
    p = _placer(preempt_after_s=0)
    p.submit(_job("saves", 4, priority=0, checkpoint_every_s=100.0), 0.0)
    p.schedule(0.0)
    p.submit(_job("never-saves", 4, priority=0), 250.0)
    p.schedule(250.0)
    p.submit(_job("urgent", 4, priority=1), 305.0)
    # at 305 s "saves" has 5 s of unsaved work, "never-saves" 55 s: the older job goes
    assert _preempted(p.schedule(305.0)) == ["saves"]


def test_fair_preemption_evicts_over_share_domains_without_ping_pong():
    c = Cluster([Node("n0", NODE, "r")])
    p = Placer(c, PlacerConfig(fair_preempt_after_s=100.0, preempt_after_s=0), {"a": 1.0, "b": 1.0})
    for k in range(4):
        p.submit(_job(f"a{k}", 2, domain="a"), 0.0)
    assert len(_started(p.schedule(0.0))) == 4  # a holds all 8 GPUs
    p.submit(_job("b0", 2, domain="b"), 10.0)
    p.submit(_job("b1", 2, domain="b"), 10.0)
    assert p.schedule(50.0) == []  # equal priority: only fair-share pre-emption, after 100 s
    log = p.schedule(110.0)
    # b0 evicts one of a's jobs (a keeps 6 GPUs >= b's 2); b1 one more (a keeps 4 >= b's 4)
    assert _started(log) == ["b0", "b1"] and len(_preempted(log)) == 2
    assert p.schedule(400.0) == []  # neither holds more per weight than the other would after a swap
    assert sorted(j[0] for j in p.running) == ["a", "a", "b", "b"]


def test_a_domain_that_just_ran_a_large_job_waits_behind_one_that_did_not():
    def next_started(half_life_s):
        c = Cluster([Node("n0", NODE, "r")])
        p = Placer(c, PlacerConfig(usage_half_life_s=half_life_s, preempt=False, reserve_after_s=None), {"a": 1.0, "b": 1.0})
        p.submit(_job("a-big", 8, domain="a"), 0.0)
        p.schedule(0.0)
        p.submit(_job("b0", 8, domain="b", at=10.0), 10.0)
        p.submit(_job("a1", 8, domain="a", at=5.0), 5.0)
        p.release("a-big", 3600.0)  # both hold nothing now; a held the whole cluster for an hour
        return _started(p.schedule(3600.0))
    assert next_started(None) == ["a1"]  # the instantaneous share ties, and a's head came first
    assert next_started(3 * 3600.0) == ["b0"]


def test_only_the_domain_the_fair_order_serves_first_gets_nodes_drained():
    c = Cluster([Node("n0", NODE, "r")])
    p = Placer(c, PlacerConfig(reserve_after_s=0.0, preempt=False), {"rich": 1.0, "poor": 1.0})
    p.submit(_job("rich0", 4, domain="rich"), 0.0)
    p.schedule(0.0)
    p.submit(_job("rich-gang", 8, domain="rich"), 0.0)
    p.submit(_job("poor-gang", 8, domain="poor"), 0.0)
    p.schedule(600.0)  # neither fits; "rich" has held half the node for 10 min, "poor" nothing
    assert list(p.reserved) == ["poor-gang"]


def test_a_class_below_its_floor_is_served_first_and_kept_there():
    p = _placer(nodes=4, preempt_after_s=0, min_class_share=0.25)  # 32 GPUs: class 0 is owed 8 while it waits
    for k in range(4):
        p.submit(_job(f"high{k}", 8, domain="h", priority=1), 0.0)
    p.submit(_job("low0", 8, domain="l", priority=0), 0.0)
    p.submit(_job("low1", 8, domain="l", priority=0), 0.0)
    assert sorted(_started(p.schedule(0.0))) == ["high0", "high1", "high2", "low0"]  # strict priority would start no low job
    p.release("high0", 10.0)
    log = p.schedule(10.0)
    assert _started(log) == ["high3"] and not _preempted(log)  # at its floor: higher priorities come first again
    p.submit(_job("high4", 8, domain="h", priority=1, at=20.0), 20.0)
    assert not _preempted(p.schedule(100.0))  # a higher priority may not evict it below its floor


def test_strict_priority_without_a_floor():
    p = _placer(nodes=4)
    for k in range(4):
        p.submit(_job(f"high{k}", 8, domain="h", priority=1), 0.0)
    p.submit(_job("low0", 8, domain="l", priority=0), 0.0)
    assert sorted(_started(p.schedule(0.0))) == ["high0", "high1", "high2", "high3"]


def test_backfill_does_not_overtake_a_blocked_head_served_first_with_hold():
    def run(hold):
        p = Placer(Cluster([Node("n0", NODE, "r")]), PlacerConfig(preempt=False, reserve_after_s=None, hold_for_first=hold),
                   {"rich": 1.0, "poor": 1.0})
        p.submit(_job("rich0", 4, domain="rich"), 0.0)
        p.schedule(0.0)
        p.submit(_job("poor-gang", 8, domain="poor", at=1.0), 1.0)
        for k in range(2):
            p.submit(_job(f"rich{k + 1}", 2, domain="rich", at=1.0), 1.0)
        first = _started(p.schedule(10.0))
        p.release("rich0", 20.0)
        return first, _started(p.schedule(20.0))
    assert run(False) == (["rich1", "rich2"], [])  # the small jobs take the half node the gang waits for
    assert run(True) == ([], ["poor-gang"])  # held: the gang starts as soon as the node frees


def test_smallest_queue_order_starts_a_domains_small_jobs_before_its_gang():
    def started(queue_order):
        p = _placer(queue_order=queue_order, preempt=False, reserve_after_s=None, backfill=False)
        p.submit(_job("blocker", 4, domain="x"), 0.0)
        p.schedule(0.0)
        p.submit(_job("gang", 8, domain="d", at=1.0), 1.0)
        p.submit(_job("small", 2, domain="d", at=2.0), 2.0)
        p.submit(_job("small2", 2, domain="d", at=3.0), 3.0)
        return _started(p.schedule(10.0))
    assert started("submitted") == []  # the gang heads its queue and does not fit beside the blocker
    assert started("smallest") == ["small", "small2"]  # fewest GPUs first, then the oldest


def test_smallest_queue_order_requeues_a_victim_by_size_ahead_of_younger_peers():
    p = _placer(queue_order="smallest", preempt_after_s=0, reserve_after_s=None)
    p.submit(_job("low", 8, domain="lo", priority=0), 0.0)
    p.schedule(0.0)
    p.submit(_job("low-young", 8, domain="lo", priority=0, at=5.0), 5.0)
    p.submit(_job("high", 8, domain="hi", priority=1, at=10.0), 10.0)
    assert _preempted(p.schedule(10.0)) == ["low"]
    assert [j.id for j in p.queues["lo"]] == ["low", "low-young"]  # same size: the older submission first


def test_checkpoint_times_count_from_when_the_job_began_working():
    p = _placer(preempt_after_s=0)
    p.submit(_job("loaded-late", 4, priority=0, checkpoint_every_s=100.0), 0.0)
    p.submit(_job("loaded-early", 4, priority=0, checkpoint_every_s=100.0), 0.0)
    p.schedule(0.0)
    p.running["loaded-late"].working_from = 40.0  # it spent 40 s loading: it saves at 140, 240, ... s
    p.running["loaded-early"].working_from = 0.0
    # at 150 s "loaded-late" saved 10 s ago, "loaded-early" 50 s ago; a clock from the start would say 50 s for both
    assert p.preemption.unsaved_s(p.running["loaded-late"], 150.0) == pytest.approx(10.0)
    p.running["loaded-early"].pace = 2.0  # it works at half speed: 75 s of work at 150 s, nothing saved yet
    assert p.preemption.unsaved_s(p.running["loaded-early"], 150.0) == pytest.approx(150.0)
    p.submit(_job("urgent", 4, priority=1), 150.0)
    assert _preempted(p.schedule(150.0)) == ["loaded-late"]


def _two_under_one_over(checkpoint_every_a: float | None, **cfg) -> Placer:
    """16 GPUs, equal weights: a holds 10 (nothing waiting), b 6 with 2 more waiting, c nothing
    with 2 waiting. The water-fill entitles c to its 2 and a and b to 7 each: a is over, b and c under."""
    p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]),
               PlacerConfig(usage_half_life_s=None, preempt_after_s=0, fair_preempt_after_s=100.0, fair_preempt_max_loss_s=60.0,
                            reserve_after_s=None, **cfg), {"a": 1.0, "b": 1.0, "c": 1.0})
    for k in range(5):
        p.submit(_job(f"a{k}", 2, domain="a", checkpoint_every_s=checkpoint_every_a), 0.0)
    for k in range(3):
        p.submit(_job(f"b{k}", 2, domain="b", checkpoint_every_s=100.0), 0.0)
    assert len(_started(p.schedule(0.0))) == 8
    p.submit(_job("b-more", 2, domain="b", at=1.0), 1.0)
    p.submit(_job("c0", 2, domain="c", at=1.0), 1.0)
    return p


def test_entitled_preemption_takes_only_from_domains_over_their_entitlement():
    # at 150 s b's jobs saved 50 s ago, a's (saving never) lose 150 s: only b's are within the 60 s cap
    by_level = _preempted(_two_under_one_over(None).schedule(150.0))
    assert len(by_level) == 1 and by_level[0].startswith("b")  # c evicts b, also under its share: the wait only moves
    p = _two_under_one_over(None, entitled_preempt=True)
    assert p.schedule(150.0) == []  # a's jobs would lose too much work, and b is no victim
    assert p.entitled.under("b") and p.entitled.under("c") and not p.entitled.under("a")
    log = _two_under_one_over(100.0, entitled_preempt=True).schedule(150.0)
    assert _started(log)[0] == "c0" and all(v.startswith("a") for v in _preempted(log))  # a's jobs saved 50 s ago too


@pytest.mark.parametrize("keeps_progress", [False, True])
def test_fair_share_victims_that_keep_progress_have_saved_since_they_started(keeps_progress):
    # (the 310 s pass finds the victim only because share-mode failures are forgotten each pass)
    p = Placer(Cluster([Node("n", NODE, "r")]),
               PlacerConfig(usage_half_life_s=None, fair_preempt_after_s=0, fair_preempt_max_loss_s=None, reserve_after_s=None,
                            preempt_keeps_progress=keeps_progress), {"a": 1.0, "b": 1.0})
    for k in range(2):  # a holds the whole node; they save every 300 s of work
        p.submit(_job(f"a{k}", 4, domain="a", checkpoint_every_s=300.0), 0.0)
    p.schedule(0.0)
    p.submit(_job("b0", 4, domain="b", at=100.0), 100.0)
    early = _preempted(p.schedule(100.0))
    assert early == ([] if keeps_progress else ["a0"])  # at 100 s neither has saved: evicting one would throw its run away
    if keeps_progress:
        assert _preempted(p.schedule(310.0)) == ["a0"] and "b0" in p.running  # saved at 300: it keeps that work


def test_a_job_killed_before_is_killed_again_only_after_it_saved():
    # with `preempt_keeps_progress` (no cap), one low-priority job is not killed again and again just after it restarts
    p = _placer(nodes=2, preempt_after_s=0, max_preemptions=None, preempt_keeps_progress=True, reserve_after_s=None)
    for k in range(2):
        p.submit(_job(f"lo{k}", 8, domain="lo", checkpoint_every_s=300.0), 0.0)
    started, kills, hi_start = {}, [], {}
    for t in range(0, 2000, 10):
        if t and t % 100 == 0 and t <= 600:  # a high-priority job every 100 s, each running 10 s
            p.submit(_job(f"hi{t}", 8, domain="hi", priority=1, at=t), t)
        for jid in [j for j, at in hi_start.items() if j in p.running and t - at >= 10]:
            p.release(jid, t)
        for what, run in p.schedule(float(t)):
            if what == "start":
                (hi_start if run.job.domain == "hi" else started)[run.job.id] = t
            else:
                kills.append((run.job.id, t, t - started[run.job.id]))
    assert [k[0] for k in kills][:2] == ["lo0", "lo1"] and len(kills) > 2 and set(hi_start) == {f"hi{t}" for t in range(100, 700, 100)}
    seen = set()
    for jid, t, ran in kills:
        assert jid not in seen or ran >= 300, f"{jid} killed again at {t} s after running only {ran} s since its restart"
        seen.add(jid)
    assert hi_start["hi300"] > 300  # at 300 both had been killed and neither had saved since: hi300 waited


def test_a_head_that_may_evict_its_peers_evicts_lower_priorities_first():
    p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]),
               PlacerConfig(usage_half_life_s=None, preempt_after_s=60, fair_preempt_after_s=0, fair_preempt_max_loss_s=None,
                            reserve_after_s=None), {"lo": 1.0, "x": 1.0, "y": 1.0})
    p.submit(_job("lo0", 8, domain="lo", priority=0), 0.0)
    p.submit(_job("x0", 8, domain="x", priority=1), 0.0)
    p.schedule(0.0)
    p.submit(_job("y0", 8, domain="y", priority=1, at=10.0), 10.0)  # y holds nothing: x is over its share
    assert _preempted(p.schedule(10.0)) == ["lo0"]  # not its peer x0, though its own grace for lower priorities is 60 s


@pytest.mark.parametrize("instant_first", [False, True])
def test_instant_first_kills_a_victim_rather_than_wait_for_a_save(instant_first):
    # at 1000 s the rollout saved 100 s ago and the training run saves in 50 s: by work lost the
    # training run is told (the head waits 50 s); instant-first kills the rollout and starts now
    p = _placer(nodes=2, notice=True, preempt_after_s=0, reserve_after_s=None, instant_first=instant_first)
    p.submit(_job("train", 8, domain="lo", checkpoint_every_s=1800.0, notice_save_s=50.0), 0.0)
    p.submit(_job("roll", 8, domain="lo", checkpoint_every_s=300.0), 0.0)
    p.schedule(0.0)
    assert sorted(len(r.nodes) for r in p.running.values()) == [1, 1] and len(p.c.node_jobs[0]) == 1
    p.submit(_job("hi0", 8, domain="hi", priority=1, at=1000.0), 1000.0)
    log = [(what, r.job.id) for what, r in p.schedule(1000.0)]
    if instant_first:
        assert log == [("preempt", "roll"), ("start", "hi0")]
    else:
        assert log == [("notice", "train")] and "hi0" in p.awaiting
        assert _started(p.schedule(1050.0)) == ["hi0"]


@pytest.mark.parametrize("split", [True, False])
def test_an_elastic_batch_starts_and_is_preempted_a_worker_at_a_time(split):
    p = _placer(nodes=2, preempt_after_s=0, split_elastic=split)
    p.submit(_job("busy", 8, domain="other"), 0.0)
    assert _started(p.schedule(0.0)) == ["busy"]
    parts = p.submit(_job("batch", 8, units=2, elastic=True), 1.0)
    if not split:  # a gang: it waits for both nodes
        assert [q.id for q in parts] == ["batch"] and p.schedule(1.0) == []
        p.release("busy", 50.0)
        assert _started(p.schedule(50.0)) == ["batch"]
        p.submit(_job("urgent", 8, priority=1, at=60.0), 60.0)
        log = p.schedule(60.0)
        assert _preempted(log) == ["batch"] and _started(log) == ["urgent"]  # the whole batch goes for one node
        return
    assert [q.id for q in parts] == ["batch#0", "batch#1"]
    assert _started(p.schedule(1.0)) == ["batch#0"]  # one worker starts on the free node now
    p.release("busy", 50.0)
    assert _started(p.schedule(50.0)) == ["batch#1"]
    p.submit(_job("urgent", 8, priority=1, at=60.0), 60.0)
    log = p.schedule(60.0)
    assert len(_preempted(log)) == 1 and _started(log) == ["urgent"] and len(p.running) == 2  # one worker goes, one keeps running


def test_a_split_batch_is_refused_when_one_of_its_shards_is_already_queued():
    p = _placer(split_elastic=True)
    p.submit(_job("batch#1", 1), 0.0)
    with pytest.raises(ValueError, match="batch#1"):
        p.submit(_job("batch", 1, units=2, elastic=True), 0.0)
    assert list(p.jobs) == ["batch#1"]  # nothing half-queued


def test_a_batch_whose_turn_it_is_starts_every_worker_that_fits_before_the_next_domain():
    p = Placer(Cluster([Node(f"n{i}", NODE, "r") for i in range(2)]), PlacerConfig(split_elastic=True, queue_order="smallest"),
               {"a": 1.0, "b": 1.0})
    p.submit(_job("batch", 8, units=2, domain="a", elastic=True), 0.0)
    p.submit(_job("other", 8, domain="b"), 0.0)
    # a comes first (equal levels, then name); once its first worker starts, a is above b, but the batch keeps its turn,
    # as the gang would have started whole
    assert _started(p.schedule(0.0)) == ["batch#0", "batch#1"] and list(p.jobs) == ["other"]


def test_work_held_outside_the_placer_is_planned_around_and_given_back():
    p = _placer(nodes=2)
    whole = p.c.nodes[0].capacity
    p.hold_outside([(0, whole), (1, whole)])  # another user holds both nodes
    p.submit(_job("a", 8), 0.0)
    assert p.schedule(1.0) == []
    p.hold_outside([(0, whole)])  # ... then gives node 1 back: the job that did not fit starts there
    log = p.schedule(2.0)
    assert _started(log) == ["a"] and log[0][1].nodes == [1]
    p.hold_outside([(0, whole)])
    p.c.check()
    assert dict(p.c.holdings["(outside work)"]) == {0: whole.units()}
