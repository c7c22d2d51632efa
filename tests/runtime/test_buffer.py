"""The replay buffer: bounds, indexes, orders, duplicate rejection, write-through and resume."""

import json
import threading

import pytest

from longhaul.runtime.buffer import Entry, ReplayBuffer, reward_spread
from longhaul.types import Trajectory, Turn
from tests.waiting import DEADLINE_S


def _group(step: int, rewards, version: int = 0):
    return [Trajectory([Turn([1, 2], [3, 4], [-0.5, -0.25], [version, version + 1], [1, 1])], r, 0, {"task_id": f"t{step}"})
            for r in rewards]


def _entry(step: int, index: int = 0, round_: int = 0, rewards=(0.0, 1.0), version: int = 0, task: str | None = None):
    group = _group(step, rewards, version)
    return Entry(f"{step}.{round_}/{index}", step, round_, index, task or f"t{step}", group, reward_spread(group))


def test_put_take_fifo_and_duplicates_rejected():
    buf = ReplayBuffer(8)
    for e in (_entry(2, 1), _entry(1, 0), _entry(2, 0)):
        assert buf.put(e)
    assert not buf.put(_entry(1, 0)), "a second copy of a uid must be rejected"
    assert buf.duplicates_rejected == 1 and len(buf) == 3
    taken = buf.take(2, step=1, timeout=0)
    assert [e.uid for e in taken] == ["1.0/0", "2.0/0"]  # by (step, round, index), not arrival
    assert not buf.put(_entry(1, 0)), "a consumed uid stays rejected"
    assert [e.uid for e in buf.take(1, step=2, timeout=0)] == ["2.0/1"]


def test_recency_and_priority_orders():
    buf = ReplayBuffer(8)
    buf.put(_entry(1, rewards=(1.0, 1.0)))  # spread 0
    buf.put(_entry(2, rewards=(0.0, 1.0)))  # spread 1
    buf.put(_entry(3, rewards=(0.5, 0.75)))  # spread 0.25
    assert [e.step for e in buf.take(3, 1, timeout=0, order="recency")] == [3, 2, 1]
    for step in (1, 2, 3):
        buf.put(_entry(step, index=1, rewards=[(1.0, 1.0), (0.0, 1.0), (0.5, 0.75)][step - 1]))
    assert [e.step for e in buf.take(3, 2, timeout=0, order="priority")] == [2, 3, 1]


def test_indexed_by_version_and_task():
    buf = ReplayBuffer(8)
    buf.put(_entry(1, version=3, task="a"))
    buf.put(_entry(2, version=5, task="a"))
    buf.put(_entry(3, version=5, task="b"))
    assert buf.versions() == {3: 1, 5: 2}  # a group's version is its oldest token's
    assert [e.step for e in buf.by_version(5)] == [2, 3]
    assert [e.step for e in buf.by_task("a")] == [1, 2]
    buf.take(1, 1, select=lambda e: e.task_id == "b", timeout=0)
    assert buf.versions() == {3: 1, 5: 1} and [e.step for e in buf.by_task("b")] == []


def test_bounded_put_waits_for_room_and_times_out():
    buf = ReplayBuffer(2)
    buf.put(_entry(1))
    buf.put(_entry(2))
    with pytest.raises(TimeoutError, match="full"):
        buf.put(_entry(3), timeout=0.05)
    done, waiting = threading.Event(), threading.Event()
    wait = buf._cond.wait

    def wait_and_tell(timeout=None):  # the producer is inside put, waiting on the buffer's condition
        waiting.set()
        return wait(timeout)

    buf._cond.wait = wait_and_tell

    def producer():
        buf.put(_entry(3))
        done.set()

    threading.Thread(target=producer, daemon=True).start()
    assert waiting.wait(DEADLINE_S)
    assert not done.is_set(), "put must wait while the buffer is full"
    buf.take(1, 1, timeout=0)
    assert done.wait(DEADLINE_S) and len(buf) == 2


def test_take_waits_for_enough_matching_groups():
    buf = ReplayBuffer(4)
    with pytest.raises(TimeoutError, match="for step 1"):
        buf.take(1, 1, timeout=0.05)
    threading.Timer(0.05, lambda: buf.put(_entry(1))).start()  # whether take waits already or not, it gets the entry
    assert [e.uid for e in buf.take(1, 1, timeout=DEADLINE_S)] == ["1.0/0"]


def test_write_through_and_resume_replays_to_the_checkpointed_step(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = ReplayBuffer.open(path, 8)
    for step in (1, 2, 3):
        buf.put(_entry(step))
    buf.note({"op": "submit", "uid": "4.0", "step": 4, "round": 0, "cursor": 6, "n": 2, "seed": 1, "min_version": 3})
    buf.take(1, 1, timeout=0)
    buf.take(1, 2, timeout=0)  # step 2 trained but (say) never checkpointed: the crash comes now
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line) for line in lines)
    with path.open("a") as f:
        f.write('{"op": "put", "uid": "9.0/0", "st')  # a torn last line
    with pytest.raises(FileExistsError):
        ReplayBuffer.open(path, 8)
    again = ReplayBuffer.open(path, 8, resume_step=1)
    assert [e.uid for e in again.take(2, 2, timeout=0)] == ["2.0/0", "3.0/0"]  # step 2's group is back, step 1's is not
    assert not again.put(_entry(1)) and not again.put(_entry(3)), "groups seen before the crash stay rejected"
    assert [r["uid"] for r in again.notes("submit")] == ["4.0"]
    g = Trajectory.from_dict(json.loads(lines[0])["group"][0])
    assert g == _group(1, (0.0, 1.0))[0], "a group survives the log exactly"


def test_capacity_is_validated():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
