"""TaskScheduler: shares match weights (chi-square), priorities pre-empt, budgets stop a domain,
draws are deterministic and a resumed scheduler continues bit for bit."""

import json
import math
import random
from collections import Counter

import pytest

from longhaul.errors import LonghaulError
from longhaul.runtime.domains import Outcome, SchedulingConfig, TaskScheduler
from tests.runtime.domains.domain_helpers import chi2_sf, chi_square, synthetic

WEIGHTS = [1.0, 2.0, 3.0, 4.0, 10.0]


def _domains(weights=WEIGHTS, **kw):
    return [synthetic(f"d{i}", 64, weight=w, **kw) for i, w in enumerate(weights)]


def _run(sched: TaskScheduler, steps: int, batch: int, seed: int = 0, group: int = 1) -> list[tuple[str, str]]:
    """Draw and record `steps` batches; outcomes are a seeded function of (task, step)."""
    rng = random.Random(seed)
    seen = []
    for _ in range(steps):
        draws = sched.next_tasks(batch)
        seen += [(d.domain, d.task.task_id) for d in draws]
        sched.record(Outcome(d.domain, d.task.task_id, 1.0, rng.random() < 0.5, tokens=10, sandbox_s=0.5)
                     for d in draws for _ in range(group))
    return seen


def test_chi_square_helper_matches_closed_forms():
    for x in (0.1, 1.0, 3.0, 10.0, 40.0):
        assert abs(chi2_sf(x, 2) - math.exp(-x / 2)) < 1e-12, x  # df 2: exp(-x/2)
        assert abs(chi2_sf(x, 1) - math.erfc(math.sqrt(x / 2))) < 1e-10, x  # df 1: erfc(sqrt(x/2))
        assert abs(chi2_sf(x, 4) - math.exp(-x / 2) * (1 + x / 2)) < 1e-12, x


def test_sampled_shares_match_weights_chi_square():
    sched = TaskScheduler(_domains(), SchedulingConfig(mixing="sample"), seed=3)
    counts = Counter(d for d, _ in _run(sched, 2000, 10))
    observed = [counts[f"d{i}"] for i in range(len(WEIGHTS))]
    stat, p = chi_square(observed, WEIGHTS)
    assert p > 0.01, f"shares {observed} vs weights {WEIGHTS}: chi2 {stat:.2f}, p {p:.4f}"
    _, p_wrong = chi_square(observed, [1.0] * len(WEIGHTS))  # the test has power: equal shares are rejected
    assert p_wrong < 1e-9


def test_stride_shares_are_exact_to_a_slot_or_two():
    sched = TaskScheduler(_domains(), SchedulingConfig(mixing="stride"), seed=0)
    seen = _run(sched, 500, 10)
    counts = Counter()
    worst = 0.0
    for k, (d, _) in enumerate(seen, 1):
        counts[d] += 1
        worst = max(worst, max(abs(counts[f"d{i}"] - k * w / sum(WEIGHTS)) for i, w in enumerate(WEIGHTS)))
    assert worst < 2.0, f"largest lag behind the weights: {worst:.2f} slots"
    _, p = chi_square([counts[f"d{i}"] for i in range(5)], WEIGHTS)
    assert p > 0.99  # far closer than i.i.d. sampling would be


def test_draws_are_deterministic_for_a_seed_and_differ_across_seeds():
    runs = [_run(TaskScheduler(_domains(), SchedulingConfig(mixing="sample"), seed=s), 20, 8) for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_a_task_in_flight_is_not_drawn_again_until_recorded():
    sched = TaskScheduler([synthetic("a", 5)], seed=0, group_size=2)
    first = sched.next_tasks(10)
    assert len(first) == 5 and len({d.task.task_id for d in first}) == 5
    assert sched.next_tasks(1) == []  # all five in flight
    sched.record([Outcome("a", first[0].task.task_id, 1.0, True)])  # one of its two episodes
    assert sched.next_tasks(1) == []
    sched.record([Outcome("a", first[0].task.task_id, 1.0, True)])
    assert [d.task.task_id for d in sched.next_tasks(3)] == [first[0].task.task_id]
    sched.cancel(first[1:3])
    assert {d.task.task_id for d in sched.next_tasks(3)} == {first[1].task.task_id, first[2].task.task_id}


def test_higher_priority_takes_every_slot_until_its_budget_is_spent():
    urgent = synthetic("urgent", 64, weight=0.1, priority=1, budget_episodes=48)
    rest = [synthetic("b", 64, weight=1.0), synthetic("c", 64, weight=3.0)]
    sched = TaskScheduler([urgent, *rest], seed=0, group_size=4)
    seen = _run(sched, 20, 4, group=4)
    domains = [d for d, _ in seen]
    assert domains[:12] == ["urgent"] * 12  # 48 episodes = 12 groups, despite its small weight
    assert "urgent" not in domains[12:]
    tail = Counter(domains[12:])
    assert tail == {"b": 17, "c": 51}  # the weights share what is left, exactly 1:3
    m = sched.metrics()
    assert m["domain/urgent/exhausted"] == 1 and m["domain/urgent/episodes_total"] == 48


def test_preemptible_lists_pending_draws_of_lower_priority_only():
    hi, lo, lo2 = synthetic("hi", 8, priority=2), synthetic("lo", 8, priority=0), synthetic("mid", 8, priority=2)
    sched = TaskScheduler([hi, lo, lo2], seed=0)
    pending = sched.next_tasks(16)  # hi and mid (equal priority) first, then lo
    assert [d.domain for d in pending].count("lo") == 0
    lo_draws = sched.next_tasks(4)  # hi and mid are all in flight now: lo fills in
    assert {d.domain for d in lo_draws} == {"lo"}
    assert sched.preemptible(pending + lo_draws) == []  # nothing of higher priority can be drawn
    sched.record([Outcome(d.domain, d.task.task_id, 0.0, False) for d in pending[:1]])  # a hi/mid task returns
    assert sched.preemptible(pending[1:] + lo_draws) == lo_draws  # equal priorities never pre-empt each other


def test_token_budget_stops_a_domain():
    a = synthetic("a", 32, budget_tokens=100)
    sched = TaskScheduler([a, synthetic("b", 32)], seed=0)
    for _ in range(10):
        draws = sched.next_tasks(2)
        sched.record([Outcome(d.domain, d.task.task_id, 0.0, False, tokens=30) for d in draws])
    m = sched.metrics()
    assert m["domain/a/tokens_total"] == 120  # soft by the batch in flight when it ran out
    assert m["domain/a/exhausted"] == 1 and m["domain/b/draws"] == 16


def test_every_domain_exhausted_ends_the_run():
    sched = TaskScheduler([synthetic("a", 8, budget_episodes=6), synthetic("b", 8, budget_episodes=3)], seed=0, group_size=3)
    total = _run(sched, 10, 4, group=3)
    assert Counter(d for d, _ in total) == {"a": 2, "b": 1}
    assert sched.exhausted and sched.next_tasks(4) == []


def test_infra_errors_count_tokens_not_episodes():
    sched = TaskScheduler([synthetic("a", 4, budget_episodes=2)], seed=0)
    d = sched.next_tasks(1)[0]
    sched.record([Outcome("a", d.task.task_id, 0.0, False, tokens=7, sandbox_s=1.5, infra_error=True)])
    m = sched.metrics()
    assert m["domain/a/infra_errors"] == 1 and m["domain/a/episodes"] == 0 and m["domain/a/tokens"] == 7
    assert "domain/a/pass_rate" not in m and m["domain/a/sandbox_s"] == 1.5
    assert len(sched.next_tasks(4)) == 2  # the budget is untouched


def test_a_guidance_demonstration_ends_its_draw_and_counts_nothing():
    sched = TaskScheduler([synthetic("a", 4, budget_episodes=2)], seed=0)
    d = sched.next_tasks(1)[0]
    queue = sched.queues[0]
    assert queue.in_flight
    sched.record([Outcome("a", d.task.task_id, 1.0, True, tokens=9, sandbox_s=1.0, guided=True)])
    m = sched.metrics()
    assert not queue.in_flight and m["domain/a/episodes"] == 0 and m["domain/a/infra_errors"] == 0
    assert m["domain/a/tokens"] == 0 and "domain/a/pass_rate" not in m


def test_metrics_are_per_step_with_running_totals():
    sched = TaskScheduler(_domains([1.0, 1.0]), seed=0)
    _run(sched, 3, 4)
    m1 = sched.metrics()
    _run(sched, 1, 4)
    m2 = sched.metrics()
    assert m1["domain/d0/draws"] == 6 and m2["domain/d0/draws"] == 2
    assert m2["domain/d0/episodes_total"] == 8 and m2["domain/d0/share"] == 0.5
    assert 0.0 <= m2["domain/d1/pass_rate"] <= 1.0 and m2["domain/d1/sandbox_s"] == 1.0
    assert sched.metrics()["domain/d0/episodes"] == 0  # nothing since


@pytest.mark.parametrize("mixing,curriculum", [("stride", "learnable_band"), ("sample", "revisit_failures"), ("sample", "retire_solved")])
def test_resume_continues_bit_for_bit(mixing, curriculum):
    cfg = SchedulingConfig(mixing=mixing, curriculum=curriculum, min_samples=2)
    make = lambda: TaskScheduler(_domains([1.0, 2.0, 5.0]), cfg, seed=11, group_size=2)
    straight = make()
    full = _run(straight, 30, 6, seed=1, group=2)
    first = make()
    head = _run(first, 15, 6, seed=1, group=2)
    saved = json.loads(json.dumps(first.state_dict()))  # JSON-able, as a checkpoint stores it
    resumed = make()
    resumed.load_state_dict(saved)
    rng = random.Random(1)
    for _ in range(15 * 6 * 2):  # replay the outcome generator to where the first half left it
        rng.random()
    tail = []
    for _ in range(15):
        draws = resumed.next_tasks(6)
        tail += [(d.domain, d.task.task_id) for d in draws]
        resumed.record(Outcome(d.domain, d.task.task_id, 1.0, rng.random() < 0.5, tokens=10, sandbox_s=0.5) for d in draws for _ in range(2))
    assert head + tail == full
    assert resumed.metrics() == straight.metrics()


def test_resume_refuses_other_domains_or_pools():
    sched = TaskScheduler(_domains([1.0, 2.0]), seed=0)
    state = sched.state_dict()
    with pytest.raises(LonghaulError, match="differ from the config"):
        TaskScheduler(_domains([1.0, 2.0, 3.0]), seed=0).load_state_dict(state)
    with pytest.raises(LonghaulError, match="another task pool"):
        TaskScheduler([synthetic("d0", 10), synthetic("d1", 64)], seed=0).load_state_dict(state)


def test_bad_input_is_one_clear_error():
    with pytest.raises(LonghaulError, match="below one group"):
        TaskScheduler([synthetic("a", 4, budget_episodes=2)], group_size=4)
    with pytest.raises(LonghaulError, match="distinct name"):
        TaskScheduler([synthetic("a", 4), synthetic("a", 4)])
    with pytest.raises(LonghaulError, match="unknown curriculum policy 'learnable'; did you mean 'learnable_band'"):
        TaskScheduler([synthetic("a", 4)], SchedulingConfig(curriculum="learnable"))
    sched = TaskScheduler([synthetic("a", 4)])
    with pytest.raises(LonghaulError, match="unknown domain 'zz'"):
        sched.record([Outcome("zz", "a/0", 0.0, False)])
    with pytest.raises(LonghaulError, match="not in domain 'a'"):
        sched.record([Outcome("a", "b/0", 0.0, False)])
