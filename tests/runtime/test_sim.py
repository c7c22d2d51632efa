"""The runtime's discrete-event model against hand-computed timelines."""

import pytest

from longhaul.runtime.sim import Costs, Workload, simulate, sweep


def _costs(**kw) -> Costs:
    base = dict(gen_fixed_s=0.0, gen_token_s=0.01, train_token_s=0.02, score_s=0.0, sync_s=0.0, lengths=[100])
    return Costs(**{**base, **kw})


def test_sync_is_the_sum_of_its_phases():
    # one worker, 2 groups x 4 samples x 100 tokens: gen 8 s, train 16 s a step
    out = simulate(_costs(), Workload(steps=3, groups=2, group_size=4))
    assert out.wall_s == pytest.approx(3 * (8 + 16))
    assert out.staleness == [0, 0, 0]
    assert out.trajectories == 24


def test_async_overlaps_generation_with_training_within_the_bound():
    # gen 8 s, train 16 s: with staleness 1 the trainer never waits after the first step
    out = simulate(_costs(), Workload(steps=4, groups=2, group_size=4, mode="async", max_staleness=1, inflight=1))
    assert out.wall_s == pytest.approx(8 + 4 * 16)
    assert max(out.staleness) <= 1
    # staleness 0 is sync
    zero = simulate(_costs(), Workload(steps=4, groups=2, group_size=4, mode="async", max_staleness=0))
    assert zero.wall_s == pytest.approx(4 * 24) and zero.staleness == [0] * 4


def test_processor_sharing_on_shared_cores():
    # both at once: gen at 0.5, train at 0.5 of their solo rates. Step 1: gen 8 s alone. Then train 1
    # (16 s of work) and gen 2 (8 s) together: gen ends at 16 s (train did 8 of 16), train ends 8 s later
    # alone; train 2 then runs alone 16 s.
    c = _costs(shared_cpu=True, gen_shared=0.5, train_shared=0.5)
    out = simulate(c, Workload(steps=2, groups=2, group_size=4, mode="async", max_staleness=1, inflight=1))
    assert out.wall_s == pytest.approx(8 + 16 + 8 + 16)


def test_fixed_decode_cost_follows_the_longest_sample_and_workers_split_a_step():
    c = _costs(gen_fixed_s=0.1, lengths=[100])
    one = simulate(c, Workload(steps=1, groups=4, group_size=2))
    assert one.wall_s == pytest.approx(0.1 * 100 + 0.01 * 800 + 0.02 * 800)
    two = simulate(c, Workload(steps=1, groups=4, group_size=2, workers=2))
    assert two.wall_s == pytest.approx(0.1 * 100 + 0.01 * 400 + 0.02 * 800)
    dp = simulate(c, Workload(steps=1, groups=4, group_size=2, workers=2, trainers=4))
    assert dp.wall_s == pytest.approx(0.1 * 100 + 0.01 * 400 + 0.02 * 800 / 4 + c.allreduce_s(4))


def test_requests_side_by_side_share_the_fixed_decode_cost():
    # per decode step 0.1 s + 0.01 s a sequence; 8 sequences of 100 tokens a request.
    # Alone: 100 x (0.1 + 0.08) = 18 s. Two at once: 100 x (0.1 + 0.16) = 26 s for both.
    c = _costs(gen_fixed_s=0.1, train_token_s=0.0)
    one = simulate(c, Workload(steps=2, groups=2, group_size=4, mode="async", max_staleness=1, inflight=1))
    two = simulate(c, Workload(steps=2, groups=2, group_size=4, mode="async", max_staleness=1, inflight=2))
    assert one.wall_s == pytest.approx(36) and two.wall_s == pytest.approx(26)
    # one request of two sequences: 100 steps of 0.1 + 2 x 0.01
    c2 = _costs(gen_fixed_s=0.1, train_token_s=0.0, lengths=[100])
    assert simulate(c2, Workload(steps=1, groups=1, group_size=2)).wall_s == pytest.approx(100 * 0.12)


def test_deterministic_for_a_seed_and_sweep_rows():
    c = _costs(lengths=[10, 50, 128, 90])
    a = simulate(c, Workload(steps=5, groups=8, group_size=4, mode="async", max_staleness=2, workers=3, seed=7))
    b = simulate(c, Workload(steps=5, groups=8, group_size=4, mode="async", max_staleness=2, workers=3, seed=7))
    assert a.wall_s == b.wall_s and a.staleness == b.staleness
    rows = sweep(c, 3, 8, 4, [1, 4], [1, 2], [1])
    assert [(r["workers"], r["trainers"]) for r in rows] == [(1, 1), (1, 2), (4, 1), (4, 2)]
    assert all(r["async1_speedup"] >= 1 - 1e-9 for r in rows)


def test_worker_start_up_delays_every_worker_once():
    # 5 s of start-up before the first request, then the same timeline as without it
    wl = dict(steps=3, groups=2, group_size=4)
    plain = simulate(_costs(), Workload(**wl, remote_workers=False))
    started = simulate(_costs(worker_start_s=5.0), Workload(**wl))
    assert started.wall_s == pytest.approx(plain.wall_s + 5.0)
    inline = simulate(_costs(worker_start_s=5.0), Workload(**wl, remote_workers=False))  # a worker in the trainer's process
    assert inline.wall_s == pytest.approx(plain.wall_s)
    two = simulate(_costs(worker_start_s=5.0), Workload(**wl, workers=2, mode="async", max_staleness=1))
    assert two.wall_s == pytest.approx(simulate(_costs(), Workload(**wl, workers=2, mode="async", max_staleness=1)).wall_s + 5.0)
