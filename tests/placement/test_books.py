"""The placer's books alone (books.py): starting and releasing a job updates every book it is
in, and an evicted job goes back ahead of the jobs that never ran."""

from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, Replica, WorkUnit
from longhaul.placement.state import PlacerConfig
from tests.placement.placement_helpers import parts

NODE = Resources(cpus=16, mem_gb=64, gpus=8)


def _job(jid: str, gpus: int, domain: str = "a", priority: int = 0, at: float = 0.0, **kw) -> Job:
    return Job(jid, domain, (WorkUnit("rollout", Resources(cpus=1, mem_gb=4, gpus=gpus)),), priority, submitted=at, **kw)


def test_starting_and_releasing_a_job_keeps_every_book():
    t = parts(Cluster([Node("n0", NODE, "r")]), PlacerConfig(usage_half_life_s=None))
    s, books = t.state, t.books
    job = _job("a0", 4, priority=1, batch="run", replica=Replica(leave_s=20.0))
    books.enqueue(job, 0.0)
    assert s.jobs == {"a0": job} and list(s.queues["a"]) == [job] and s.waiting_since == {"a0": 0.0}
    run = books.start(job, [0], 5.0)
    assert s.running == {"a0": run} and s.by_priority[1] == {"a0": run} and not s.jobs and not s.queues["a"]
    assert s.c.holdings["a0"] == [(0, (1000, 4096, 4))] and s.replicas_running == {"run": {"a0"}}
    assert s.class_held[1] == 0.5 and s.level("a", 5.0) == 0.5  # half the GPUs, charged at once
    assert books.release("a0", 10.0) is run
    assert not s.running and not s.by_priority[1] and not s.replicas_running and "a0" not in s.c.holdings
    assert s.class_held[1] == 0.0 and s.level("a", 10.0) == 0.0


def test_an_evicted_job_goes_back_ahead_of_jobs_that_never_ran():
    for order, want in (("fair", ["late", "early", "later"]), ("fifo", ["early", "late", "later"])):
        t = parts(Cluster([Node("n0", NODE, "r")]), PlacerConfig(order=order))
        jobs = {jid: _job(jid, 4, at=at) for jid, at in (("early", 0.0), ("late", 5.0), ("later", 6.0))}
        t.books.enqueue(jobs["late"], 5.0)
        t.books.start(jobs["late"], [0], 5.0)
        t.books.enqueue(jobs["early"], 5.0)  # submitted at 0, queued behind nothing that ran
        t.books.enqueue(jobs["later"], 6.0)
        t.books.release("late", 7.0)
        t.books.requeue(jobs["late"], 7.0)
        assert [j.id for j in t.state.queues[t.books.key(jobs["late"])]] == want, order
