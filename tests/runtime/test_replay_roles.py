"""The replay buffer with multi-agent groups: a role index beside the version and task ones,
take and select by role, resume keeps roles, single-agent logs unchanged; and the pool
benchmark's core at a tiny size."""

import json
from dataclasses import asdict

import pytest

from longhaul.runtime.buffer import Entry, ReplayBuffer, reward_spread
from longhaul.types import Score, Trajectory, Turn


def _group(step: int, role: str | None, n: int = 2, version: int = 0) -> list[Trajectory]:
    info = {"task_id": f"t{step}"} if role is None else {"task_id": f"t{step}", "role": role, "episode": f"e{step}", "policy": role}
    return [Trajectory([Turn([1, 2], [3, 4], [-0.5, -0.25], [version, version], [1, 1])], float(k % 2), 0, dict(info))
            for k in range(n)]


def _entry(step: int, role: str | None, index: int = 0, version: int = 0) -> Entry:
    group = _group(step, role, version=version)
    return Entry(f"{step}.0/{index}", step, 0, index, f"t{step}", group, reward_spread(group))


def _team(buf: ReplayBuffer, steps=(1, 2, 3), roles=("coder", "tester")) -> None:
    for step in steps:
        for i, role in enumerate(roles):
            assert buf.put(_entry(step, role, i))


def test_take_and_select_by_role():
    buf = ReplayBuffer(16)
    _team(buf)
    assert buf.roles() == {"coder": 3, "tester": 3}
    assert [e.uid for e in buf.by_role("tester")] == ["1.0/1", "2.0/1", "3.0/1"]
    taken = buf.take(2, step=1, role="tester", timeout=0)
    assert [(e.uid, e.role) for e in taken] == [("1.0/1", "tester"), ("2.0/1", "tester")]  # FIFO within the role
    assert buf.roles() == {"coder": 3, "tester": 1}
    assert [e.uid for e in buf.select(lambda e: e.step >= 2, role="coder")] == ["2.0/0", "3.0/0"]
    with pytest.raises(TimeoutError, match="of role 'tester'"):
        buf.take(2, step=2, role="tester", timeout=0.01)
    assert [e.uid for e in buf.take(2, step=2, timeout=0)] == ["1.0/0", "2.0/0"]  # no role: any role's, FIFO
    assert buf.select(lambda e: True, role="reviewer") == [] and buf.by_role("reviewer") == []


def test_a_group_that_mixes_roles_is_refused():
    buf = ReplayBuffer(4)
    group = _group(1, "coder") + _group(1, "tester")
    with pytest.raises(ValueError, match="mixes roles"):
        buf.put(Entry("1.0/0", 1, 0, 0, "t1", group))
    assert len(buf) == 0 and "1.0/0" not in buf


def test_indexes_keep_no_empty_keys():
    buf = ReplayBuffer(16)
    _team(buf)
    buf.take(6, step=1, timeout=0)
    assert buf.roles() == {} and buf.versions() == {}
    assert buf._by_task == {} and buf._by_role == {} and buf._by_version == {}


def test_resume_keeps_roles(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = ReplayBuffer.open(path, 16)
    _team(buf)
    buf.take(1, step=1, role="coder", timeout=0)
    buf.take(2, step=2, role="tester", timeout=0)  # step 2 never checkpointed
    buf.close()
    again = ReplayBuffer.open(path, 16, resume_step=1)
    assert again.roles() == {"coder": 2, "tester": 3}
    assert [e.uid for e in again.take(2, step=2, role="tester", timeout=0)] == ["1.0/1", "2.0/1"]
    assert [t.info["role"] for e in again.by_role("coder") for t in e.group] == ["coder"] * 4


def test_single_agent_groups_are_unchanged(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = ReplayBuffer.open(path, 8)
    for step in (1, 2):
        buf.put(_entry(step, None))
    assert buf.roles() == {None: 2} and [e.role for e in buf.take(1, step=1, timeout=0)] == [None]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(rows[0]) == ["op", "uid", "step", "round", "index", "task_id", "priority", "group"]
    assert rows[-1] == {"op": "take", "step": 1, "uids": ["1.0/0"]}
    assert "role" not in rows[0]["group"][0]["info"]


def test_the_log_holds_what_asdict_gives():
    traj = Trajectory([Turn([5, 6, 7], [8], [-0.125], [2], [1], segment=1, reward=0.5)] * 2, 1.0, 3,
                      {"role": "tester", "score": Score(1.0, True, "pass"), "nested": {"a": [1, 2]}})
    d = traj.to_dict()
    assert d == asdict(traj) and list(d) == list(asdict(traj))
    assert d["turns"][0]["prompt_ids"] is not traj.turns[0].prompt_ids, "to_dict is a copy"
    assert Trajectory.from_dict(json.loads(json.dumps(d))).turns == traj.turns


def test_put_wait_counts_a_full_buffer():
    buf = ReplayBuffer(1)
    buf.put(_entry(1, "coder"))
    with pytest.raises(TimeoutError, match="full"):
        buf.put(_entry(2, "coder"), timeout=0.05)
    assert buf.put_wait_s >= 0.05 and buf.take_wait_s == 0.0
def test_pool_benchmark_runs_at_a_tiny_size(tmp_path):
    from benchmarks.multi_agent_pool import PoolBench, main_result, run

    cfg = PoolBench(turns=256, roles=4, group=2, turns_per_role=2, workers=2, episodes_per_step=2, gen_tok_s=0.0,
                    prompt=(60, 120), completion=(5, 20), train_tokens=32, sample_s=0.05)
    res = run(cfg, "async", tmp_path / "async")
    assert res["turns"] >= 256 and res["groups_put"] == res["groups_taken"] == res["episodes"] * 4
    assert set(res["taken_by_role"]) == {"role0", "role1", "role2", "role3"}
    assert len(set(res["taken_by_role"].values())) == 1, "the trainer reads every role alike"
    assert res["updates"] == res["steps"] * 4 and 0 <= res["staleness_mean"] <= res["staleness_max"] <= res["steps"]
    assert 0 <= res["pool_share"] < 1 and res["rss_mb"]["end"] > 0 and res["samples"]
    puts = [json.loads(line) for line in (tmp_path / "async" / "buffer.jsonl").read_text().splitlines()]
    assert sum(r["op"] == "put" for r in puts) == res["groups_put"]
    out = tmp_path / "multi_agent_pool.json"
    main_result(cfg, [res], out)
    data = json.loads(out.read_text())
    assert data["runs"][0]["mode"] == "async" and data["config"]["turns"] == 256 and "host" in data
    assert out.with_suffix(".html").read_text().startswith("<!doctype html>")
