"""The job queue's books and its refusals without a cluster: runs persist across a reopen (a
restart of the service), a state moves only from where it is said to come from, a run no node
could hold is named as such, and bad submissions and settings get one line."""

import pytest

from longhaul.jobqueue.commands import placer_settings
from longhaul.jobqueue.runner import last_error
from longhaul.jobqueue.service import unplaceable
from longhaul.jobqueue.store import RunRecord, RunStore
from longhaul.placement.cluster import Node, Resources
from longhaul.errors import LonghaulError
from tests.cli_main import run_main


def rec(**kw) -> RunRecord:
    return RunRecord(id="", domain=kw.pop("domain", "d"), priority=kw.pop("priority", 0), config="name: x\n", **kw)


def test_runs_survive_a_reopen_and_move_only_from_the_states_named(tmp_path):
    db = tmp_path / "q.sqlite"
    store = RunStore(db)
    a, b = store.add(rec()), store.add(rec(domain="e", priority=3))
    assert (a.id, b.id) == ("r0001", "r0002") and a.state == "queued" and a.submitted > 0
    assert store.move(a.id, ("queued",), "starting", node="n1", attempts=1).state == "starting"
    assert store.move(a.id, ("queued",), "running") is None  # it is not queued any more: nothing changes
    assert store.get(a.id).state == "starting"
    store.update(b.id, cancel=True)
    store.close()
    again = RunStore(db)  # the service restarted
    assert [(r.id, r.state, r.node, r.attempts, r.cancel) for r in again.all()] == \
        [("r0001", "starting", "n1", 1, False), ("r0002", "queued", "", 0, True)]
    assert [r.id for r in again.all(("queued",))] == ["r0002"]
    assert again.add(rec()).id == "r0003"  # ids never repeat
    with pytest.raises(ValueError, match="unknown run state"):
        again.move(a.id, ("starting",), "paused")
    with pytest.raises(ValueError, match="with move"):
        again.update(a.id, state="done")
    with pytest.raises(ValueError, match="no field 'colour'"):
        again.update(a.id, colour="red")


def test_a_run_no_node_could_hold_is_named_with_the_largest_node():
    nodes = [Node("a", Resources(4, 16, 0)), Node("b", Resources(2, 8, 1))]
    assert unplaceable(rec(cpus=2, gpus=1), nodes) is None
    why = unplaceable(rec(cpus=1, gpus=4), nodes)
    assert "no node of the cluster has 1 CPUs, 0 GB and 4 GPUs" in why and "2 CPUs, 8 GB, 1 GPUs" in why
    assert "no alive node" in unplaceable(rec(), [])


def test_placer_settings_are_checked_before_anything_starts():
    assert placer_settings(["preempt_after_s=0", "policy=first_fit"])["preempt_after_s"] == 0
    with pytest.raises(LonghaulError, match="key=value"):
        placer_settings(["preempt_after_s"])
    with pytest.raises(LonghaulError, match="--placer bogus"):
        placer_settings(["bogus=1"])


def test_a_failed_runs_reason_is_its_error_line():
    assert last_error("step 1\nerror: data file 'x.jsonl' not found; pass data.path\n") == \
        "error: data file 'x.jsonl' not found; pass data.path"
    assert last_error("Traceback\n  ...\nValueError: bad\n") == "ValueError: bad"
    assert last_error("") == "(no output)"


def test_bad_submissions_are_refused_before_reaching_a_cluster(tmp_path):
    r = run_main("submit", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "config file" in r.stderr and "not found" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "run.yaml").write_text("name: q\nmodel:\n  name: tiny-llama\n")
    r = run_main("submit", "run.yaml", "--cpus", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--cpus must be > 0" in r.stderr
    r = run_main("submit", "run.yaml", "--domain", "a b", cwd=tmp_path)
    assert r.returncode == 2 and "--domain 'a b'" in r.stderr
