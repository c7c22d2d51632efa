"""Curriculum policies on synthetic pass rates: tasks that always fail, pass half the time, always pass."""

import random
from collections import Counter

import pytest

from longhaul.runtime.domains import Outcome, SchedulingConfig, TaskScheduler
from longhaul.runtime.domains.curriculum import CURRICULA, TaskStats
from tests.runtime.domains.domain_helpers import synthetic

TRUE_RATE = {0: 0.0, 1: 0.5, 2: 1.0}  # task i has pass probability TRUE_RATE[i % 3]
GROUP = 4


def _simulate(curriculum: str, steps: int = 300, batch: int = 5, **cfg) -> tuple[Counter, Counter, TaskScheduler]:
    """Draw and record `steps` batches from one 30-task domain; draws counted by kind, in the
    first and second half."""
    sched = TaskScheduler([synthetic("d", 30)], SchedulingConfig(curriculum=curriculum, **cfg), seed=0, group_size=GROUP)
    rng = random.Random(0)
    early, late = Counter(), Counter()
    for step in range(steps):
        draws = sched.next_tasks(batch)
        for d in draws:
            kind = int(d.task.task_id.split("/")[1]) % 3
            (early if step < steps // 2 else late)[kind] += 1
            sched.record(Outcome("d", d.task.task_id, 0.0, rng.random() < TRUE_RATE[kind]) for _ in range(GROUP))
    return early, late, sched


def test_uniform_draws_every_kind_alike():
    early, late, _ = _simulate("uniform")
    total = early + late
    for kind in (0, 1, 2):
        assert abs(total[kind] / sum(total.values()) - 1 / 3) < 0.05, total


def test_learnable_band_favours_tasks_between_0_and_1():
    cfg = dict(boost=4.0, floor=0.1, min_samples=4)
    _, late, sched = _simulate("learnable_band", **cfg)
    # once every task has 4 outcomes: weights 4 (rate in (0,1)) vs 0.1 (rate 0 or 1)
    expected = 4.0 / (4.0 + 0.1 + 0.1)
    share = late[1] / sum(late.values())
    assert abs(share - expected) < 0.04, (late, expected)
    assert late[0] > 0 and late[2] > 0  # the floor keeps the extremes alive
    assert sched.metrics()["domain/d/tasks_learnable"] == 10


def test_retire_solved_never_draws_a_solved_task_again():
    _, _, sched = _simulate("retire_solved", min_samples=GROUP)
    q = sched.queues[0]
    for i, s in enumerate(q.stats):
        if TRUE_RATE[i % 3] == 1.0:
            assert s.draws == 1, (i, s.draws)  # one group of 4 passes retires it
        if TRUE_RATE[i % 3] == 0.0:
            assert q.weights[i] == 1.0  # never solved, never retired
    retired = sched.metrics()["domain/d/tasks_retired"]
    assert retired >= 10 and retired == sum(1 for w in q.weights if w == 0)


def test_retiring_every_task_exhausts_the_domain():
    sched = TaskScheduler([synthetic("d", 6)], SchedulingConfig(curriculum="retire_solved", min_samples=2), seed=0, group_size=2)
    for _ in range(4):
        draws = sched.next_tasks(6)
        sched.record(Outcome("d", d.task.task_id, 1.0, True) for d in draws for _ in range(2))
    assert sched.exhausted and sched.next_tasks(1) == []


def test_revisit_failures_draws_failing_tasks_boost_times_as_often():
    _, late, _ = _simulate("revisit_failures", boost=4.0)
    ratio = late[0] / late[2]
    assert 3.2 < ratio < 4.8, late  # weight 4 (recent failure) vs 1 (all recent passes)
    assert abs(late[1] / late[0] - 1.0) < 0.2  # half-passing tasks fail recently too


@pytest.mark.parametrize("name", sorted(CURRICULA))
def test_policies_give_unexplored_tasks_weight_1_and_never_negative(name):
    cfg = SchedulingConfig()
    assert CURRICULA[name](TaskStats(), cfg) == 1.0
    rng = random.Random(name)
    for _ in range(200):
        s = TaskStats()
        for _ in range(rng.randrange(40)):
            s.add(rng.random() < 0.5, cfg.window)
        assert CURRICULA[name](s, cfg) >= 0.0 and s.n <= cfg.window


def _kinds_domain(n: int = 300):
    """Task i is of sub-family k{i % 3}, with pass probability TRUE_RATE[i % 3]."""
    from types import SimpleNamespace

    from longhaul.runtime.domains import Domain

    return Domain("d", [SimpleNamespace(task_id=f"d/{i}", subfamily=f"k{i % 3}") for i in range(n)])


def _late_draws(sched, steps: int, per_step: int, rates: dict, seed: int) -> Counter:
    """Draw `per_step` tasks a step, record a group of outcomes at each kind's pass rate, and
    count the kinds drawn from step 10 on."""
    rng, late = random.Random(seed), Counter()
    for step in range(steps):
        for d in sched.next_tasks(per_step):
            kind = int(d.task.task_id.split("/")[1]) % 3
            if step >= 10:
                late[kind] += 1
            sched.record(Outcome("d", d.task.task_id, 0.0, rng.random() < rates[kind]) for _ in range(GROUP))
    return late


def test_subfamily_unit_pools_outcomes_so_unseen_tasks_of_a_hopeless_kind_are_weighed_down():
    """300 tasks, 60 draws: most tasks are drawn once or never, so per-task outcomes cannot tell
    the kinds apart; pooled per sub-family they can, for tasks not yet drawn too."""
    results = {}
    for unit in ("task", "subfamily"):
        cfg = SchedulingConfig(curriculum="learnable_band", curriculum_unit=unit, boost=4.0, floor=0.1, min_samples=4)
        sched = TaskScheduler([_kinds_domain()], cfg, seed=0, group_size=GROUP)
        results[unit] = (_late_draws(sched, 30, 2, TRUE_RATE, seed=0), sched.queues[0])
    late, q = results["subfamily"]
    assert late[1] / sum(late.values()) > 0.8, late  # weights 4 vs 0.1 and 0.1 once each kind has 4 outcomes
    assert {q.weights[i] for i in range(len(q.weights)) if i % 3 == 0} == {0.1}, "every k0 task, drawn or not"
    assert q.stats[0] is q.stats[3] and q.stats[0].draws > 1  # one record per sub-family
    late_task, _ = results["task"]
    assert late_task[1] / sum(late_task.values()) < 0.5, late_task  # per task: no draw has told the kinds apart


def test_subfamily_unit_resumes_and_refuses_a_checkpoint_kept_per_task():
    from longhaul.errors import LonghaulError

    def make(unit):
        return TaskScheduler([_kinds_domain(30)], SchedulingConfig(curriculum="learnable_band", curriculum_unit=unit), seed=0, group_size=GROUP)

    first = make("subfamily")
    for d in first.next_tasks(3):
        first.record(Outcome("d", d.task.task_id, 1.0, True) for _ in range(GROUP))
    state = first.state_dict()
    again = make("subfamily")
    again.load_state_dict(state)
    assert again.queues[0].weights == first.queues[0].weights and again.metrics() == first.metrics()
    with pytest.raises(LonghaulError, match="resume with the same scheduling.curriculum_unit"):
        make("task").load_state_dict(state)


def _stats(passes: int, n: int) -> TaskStats:
    s = TaskStats()
    for i in range(n):
        s.add(i < passes, 64)
    return s


def test_expected_signal_is_the_chance_a_group_has_mixed_outcomes_relative_to_a_coin():
    f, cfg = CURRICULA["expected_signal"], SchedulingConfig()
    # Beta(1, 1) posterior mean p = (passes + 1) / (n + 2); weight (1 - p^4 - (1 - p)^4) / (1 - 2 / 16)
    assert f(_stats(0, 4), cfg, 4) == pytest.approx((1 - (1 / 6) ** 4 - (5 / 6) ** 4) / 0.875, abs=1e-12)
    assert f(_stats(0, 4), cfg, 4) == pytest.approx(0.591, abs=1e-3)
    assert f(_stats(0, 16), cfg, 4) == pytest.approx(0.234, abs=1e-3)
    assert f(_stats(8, 16), cfg, 4) == pytest.approx(1.0)
    assert f(_stats(16, 16), cfg, 4) == pytest.approx(f(_stats(0, 16), cfg, 4))  # solved and hopeless alike
    assert f(_stats(3, 12), cfg, 8) > f(_stats(3, 12), cfg, 2)  # bigger groups find a rare pass more often
    assert f(_stats(2, 8), cfg, 1) == pytest.approx(4 * 0.3 * 0.7)  # one sample: its variance, p (1 - p) / (1/4)


def test_expected_signal_keeps_drawing_a_kind_whose_first_group_failed():
    """A sub-family that passes 10% of the time fails a group of 4 two times in three; the band
    then floors it 40x below a learnable one until a pass comes back into its window, while
    expected_signal weighs it ~0.6 after one failed group (measured: 0.30 of the later draws
    against 0.20 for the band, which gives the learnable kind 0.78)."""
    rates = {0: 0.1, 1: 0.5, 2: 1.0}
    shares = {}
    for name in ("learnable_band", "expected_signal"):
        cfg = SchedulingConfig(curriculum=name, curriculum_unit="subfamily", boost=4.0, floor=0.1, min_samples=4)
        sched = TaskScheduler([_kinds_domain(30)], cfg, seed=1, group_size=GROUP)
        late = _late_draws(sched, 60, 8, rates, seed=1)
        shares[name] = {k: late[k] / sum(late.values()) for k in rates}
    assert shares["expected_signal"][0] > 0.25 and shares["expected_signal"][0] > 1.3 * shares["learnable_band"][0], shares
    assert shares["learnable_band"][1] > shares["expected_signal"][1] + 0.15, shares  # the band concentrates on one kind
    assert shares["expected_signal"][1] > shares["expected_signal"][2], shares  # still favours the learnable kind
