"""Domains from real task families: the envcheck gate (a stale manifest is refused), version
pins, pools without excluded tasks, per-domain limits and reward shaping; a five-domain
scheduler over echo and funcgen hands out real tasks."""

import json
from collections import Counter

import pytest
from pydantic import ValidationError

from longhaul.envs import get_family
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import load_manifest, save_manifest
from longhaul.runtime.domains import DomainConfig, Outcome, SchedulingConfig, TaskScheduler, build_domains
from longhaul.runtime.domains.domains import build_domain

FIVE = [
    {"family": "echo", "name": "echo-easy", "weight": 1.0, "tasks": 16},
    {"family": "echo", "name": "echo-hard", "difficulty": 3, "weight": 2.0, "tasks": 16, "max_new_tokens": 24},
    {"family": "funcgen", "name": "funcgen-arith", "subfamilies": ["arith.abs_diff", "arith.clamp"], "weight": 3.0, "tasks": 16},
    {"family": "funcgen", "name": "funcgen-classes", "subfamilies": ["classes.counter"], "weight": 1.0, "tasks": 8,
     "sandbox": {"wall_s": 3.0, "memory_bytes": 268435456}, "exec_timeout_s": 2.0},
    {"family": "funcgen", "name": "funcgen-d2", "difficulty": 2, "weight": 1.0, "priority": 1, "budget_episodes": 8, "tasks": 8,
     "reward_scale": 2.0, "reward_offset": -1.0},
]


def _cfgs(items=FIVE):
    return [DomainConfig.model_validate(x) for x in items]


def test_five_real_domains_share_a_run():
    sched = TaskScheduler.from_config(_cfgs(), SchedulingConfig(), seed=0, group_size=2)
    seen = Counter()
    for _ in range(12):
        draws = sched.next_tasks(4)
        for d in draws:
            dom = sched.domain(d.domain)
            assert d.task.family == dom.family.name and d.task.version == dom.version and d.task.prompt
            seen[d.domain] += 1
        sched.record(Outcome(d.domain, d.task.task_id, 1.0, True, tokens=20) for d in draws for _ in range(2))
    assert seen["funcgen-d2"] == 4  # priority 1 first, until its 8 episodes (4 groups of 2) are spent
    assert set(seen) == {c["name"] for c in FIVE}
    m = sched.metrics()
    assert {k for k in m if k.endswith("/pass_rate")} == {f"domain/{c['name']}/pass_rate" for c in FIVE}
    assert m["domain/funcgen-d2/exhausted"] == 1


def test_domain_limits_shaping_and_pools():
    arith, classes, d2 = (build_domain(c) for c in _cfgs(FIVE[2:5]))
    assert {t.subfamily for t in arith.tasks} <= {"arith.abs_diff", "arith.clamp"} and len(arith.tasks) == 16
    spec = classes.limits.sandbox_spec()
    assert spec.wall_s == 3.0 and spec.memory_bytes == 256 << 20 and classes.limits.exec_timeout_s == 2.0
    assert arith.limits.max_turns is None  # the run's rollout section decides
    assert d2.shape(1.0) == 1.0 and d2.shape(0.0) == -1.0 and arith.shape(0.5) == 0.5
    assert build_domains(_cfgs(FIVE[:1]))[0].name == "echo-easy"


def test_a_stale_manifest_entry_is_refused(tmp_path):
    data = load_manifest()
    data["families"]["funcgen"] = {**data["families"]["funcgen"], "content_hash": "0" * 16}
    stale = save_manifest(data, tmp_path / "manifest.json")
    with pytest.raises(LonghaulError, match="manifest of task family 'funcgen' is stale.*longhaul envcheck funcgen"):
        TaskScheduler.from_config(_cfgs(), manifest=stale)
    missing = save_manifest({"families": {}}, tmp_path / "empty.json")
    with pytest.raises(LonghaulError, match="has not been validated"):
        build_domain(_cfgs(FIVE[:1])[0], missing)
    assert build_domain(DomainConfig(family="echo", require_envcheck=False), missing).tasks  # opted out


def test_tasks_envcheck_excluded_never_enter_the_pool(tmp_path):
    data = load_manifest()
    first = get_family("echo").make_split("train", 3, 1, None)
    data["families"]["echo"] = {**data["families"]["echo"], "flaky": [first[0].task_id], "failing": [first[2].task_id]}
    path = save_manifest(data, tmp_path / "manifest.json")
    pool = build_domain(DomainConfig(family="echo", tasks=10), path).tasks
    ids = [t.task_id for t in pool]
    assert len(ids) == 10 and first[0].task_id not in ids and first[2].task_id not in ids and first[1].task_id in ids


@pytest.mark.parametrize("item,message", [
    ({"family": "echo", "version": "0"}, "pins version '0' of family 'echo'"),
    ({"family": "humaneval"}, "evaluation-only"),
    ({"family": "echo", "subfamilies": ["nope"]}, "has no sub-family 'nope'"),
    ({"family": "funcgen", "sandbox": {"wal_s": 1}}, "unknown sandbox key 'wal_s'"),
    ({"family": "funcgen", "sandbox": {"wall_s": -1}}, "SandboxSpec.wall_s must be positive"),
    ({"family": "nosuch"}, "unknown task family 'nosuch'"),
])
def test_bad_domains_are_one_clear_error(item, message):
    with pytest.raises(LonghaulError, match=message):
        build_domain(DomainConfig.model_validate(item))


def test_config_validation():
    with pytest.raises(ValidationError, match="wieght"):
        DomainConfig.model_validate({"family": "echo", "wieght": 2})
    with pytest.raises(ValidationError):
        DomainConfig.model_validate({"family": "echo", "weight": 0})
    with pytest.raises(LonghaulError, match="both named 'echo'"):
        build_domains(_cfgs([{"family": "echo"}, {"family": "echo", "difficulty": 2}]))
    with pytest.raises(LonghaulError, match="list is empty"):
        build_domains([])
    assert json.loads(DomainConfig(family="echo").model_dump_json())["weight"] == 1.0
