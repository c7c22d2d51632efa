"""Async agent jobs: POST /v1/jobs runs a whole episode (answer families in AnswerEnv, workspace
families in the real bubblewrap sandbox) on the server's engine; GET reports status and the
trajectory; jobs are private to their key and the queue is bounded; a job survives a server
killed mid-episode (SQLite, and Redis Streams against a real redis-server)."""

import signal
import time

import httpx
import pytest

from longhaul.serve.jobs.redis_store import RedisJobStore
from longhaul.serve.jobs.store import SqliteJobStore
from tests.serve.conftest import free_port, running_server, start_cli_server, wait_ready
from tests.waiting import wait_until

A, B = {"Authorization": "Bearer k-a"}, {"Authorization": "Bearer k-b"}


def wait_status(base, job_id, statuses, headers=A, timeout=120.0, poll=0.05) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        rec = httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        if rec.get("status") in statuses:
            return rec
        time.sleep(poll)
    raise AssertionError(f"job {job_id} not in {statuses} after {timeout} s: {rec}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # tiny-llama reads bytes: a workspace prompt (system prompt with the tool schemas) is ~2.2k tokens
    with running_server(tmp_path_factory.mktemp("jobs"), api_keys=["k-a", "k-b"], max_model_len=4096) as (base, _):
        yield base


def test_an_answer_job_runs_an_episode_and_reports_its_trajectory(server):
    r = httpx.post(server + "/v1/jobs", json={"family": "echo", "seed": 3, "max_new_tokens": 8}, headers=A)
    assert r.status_code == 202 and r.json()["status"] == "queued" and r.json()["id"].startswith("job_")
    rec = wait_status(server, r.json()["id"], ("succeeded", "failed"))
    assert rec["status"] == "succeeded" and rec["attempts"] == 1 and rec["error"] is None
    res = rec["result"]
    assert res["info"]["task_id"].startswith("echo/") and 0.0 <= res["reward"] <= 1.0 and res["ended"] in ("done", "truncated")
    (turn,) = res["turns"]
    assert 1 <= len(turn["completion_ids"]) <= 8 and len(turn["logprobs"]) == len(turn["completion_ids"])
    assert rec["spec"]["family"] == "echo" and rec["started_at"] <= rec["finished_at"]
    assert httpx.get(f"{server}/v1/jobs/{rec['id']}", headers=B).status_code == 404  # another key's job does not exist for it


def test_a_workspace_job_runs_turns_in_the_sandbox(server):
    r = httpx.post(server + "/v1/jobs", json={"family": "terminal", "seed": 1, "max_turns": 2, "max_new_tokens": 16}, headers=A)
    rec = wait_status(server, r.json()["id"], ("succeeded", "failed"))
    assert rec["status"] == "succeeded", rec["error"]
    res = rec["result"]
    assert len(res["turns"]) == 2 and res["ended"] == "truncated" and res["passed"] is False
    assert "No tool call found" in res["transcript"]  # the env's observation of the 16-token reply
    first, second = res["turns"]
    assert second["prompt_ids"][:len(first["prompt_ids"]) + len(first["completion_ids"])] == first["prompt_ids"] + first["completion_ids"]


def test_bad_job_specs_get_400(server):
    for body, words in [({"family": "nope"}, "unknown task family"), ({"family": "echo", "seed": -1}, "seed"),
                        ({"family": "echo", "difficulty": 9}, "difficulties"), ({"family": "echo", "turns": 3}, "turns"),
                        ({"family": "humaneval", "split": "train"}, "no split")]:
        r = httpx.post(server + "/v1/jobs", json=body, headers=A)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert httpx.get(server + "/v1/jobs/job_missing", headers=A).status_code == 404


def test_the_job_queue_is_bounded(tmp_path):
    with running_server(tmp_path, job_workers=0, max_queued_jobs=2) as (base, _):
        for _ in range(2):
            assert httpx.post(base + "/v1/jobs", json={"family": "echo"}).status_code == 202
        r = httpx.post(base + "/v1/jobs", json={"family": "echo"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full" and int(r.headers["retry-after"]) > 0
        metrics = httpx.get(base + "/metrics").text
        assert 'longhaul:jobs{model_name="tiny-llama",status="queued"} 2.0' in metrics


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.slow)])  # Redis recovery: also the store test below
def test_a_job_survives_a_server_killed_mid_episode(backend, tmp_path, request):
    args = ["--model", "tiny-llama", "--dtype", "float32", "--api-key", "k-a", "--max-model-len", "4096", "--jobs-db",
            str(tmp_path / "jobs.sqlite"), "--job-workers", "1"]
    if backend == "redis":
        args += ["--queue", request.getfixturevalue("redis_url")]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_cli_server(port, *args)
    try:
        wait_ready(base, 120, proc)
        long = {"family": "terminal", "seed": 2, "max_turns": 2, "max_new_tokens": 64, "temperature": 1.0}
        first = httpx.post(base + "/v1/jobs", json=long, headers=A).json()["id"]
        second = httpx.post(base + "/v1/jobs", json={"family": "echo", "max_new_tokens": 4}, headers=A).json()["id"]
        # the server is frozen the moment its store says the first job runs (read straight from the store, not
        # over HTTP), then the store is checked again: the kill lands mid-episode, on a loaded machine too
        store = RedisJobStore(request.getfixturevalue("redis_url")) if backend == "redis" else SqliteJobStore(tmp_path / "jobs.sqlite")
        try:
            wait_until(lambda: store.get(first)["status"] != "queued", interval=0.005, what="the first job to start")
            proc.send_signal(signal.SIGSTOP)
            at_kill = (store.get(first)["status"], store.get(second)["status"])
        finally:
            store.close()
        assert at_kill == ("running", "queued"), f"not mid-episode when the server was frozen: {at_kill}"
        proc.send_signal(signal.SIGKILL)  # no shutdown hook runs: the store alone must carry the jobs
        proc.wait(30)
        proc = start_cli_server(port, *args)
        wait_ready(base, 120, proc)
        a = wait_status(base, first, ("succeeded", "failed"), timeout=180)
        b = wait_status(base, second, ("succeeded", "failed"), timeout=60)
    finally:
        proc.kill()
        proc.wait(30)
    assert a["status"] == "succeeded" and a["attempts"] == 2 and a["result"]["turns"], a["error"]  # re-run from its start
    assert b["status"] == "succeeded" and b["attempts"] == 1


def test_sqlite_store_claims_in_order_and_recovers_running_jobs(tmp_path):
    s = SqliteJobStore(tmp_path / "j.sqlite")
    ids = [s.submit({"n": i}, "o", 10)["id"] for i in range(3)]
    job = s.claim("w", 0.1)
    assert job["id"] == ids[0] and job["status"] == "running" and job["attempts"] == 1
    s.close()
    s = SqliteJobStore(tmp_path / "j.sqlite")  # a new process: the running job is queued again, first in line
    assert s.recover("w") == 1 and s.counts() == {"queued": 3, "running": 0, "succeeded": 0, "failed": 0}
    again = s.claim("w", 0.1)
    assert again["id"] == ids[0] and again["attempts"] == 2
    s.finish(again, {"ok": True})
    assert s.get(ids[0])["result"] == {"ok": True} and s.get(ids[0])["status"] == "succeeded"
    assert s.submit({}, "o", max_queued=2) is None  # two still queued: full
    assert s.claim("w", 0.1)["id"] == ids[1]


def test_redis_store_hands_a_dead_replicas_job_to_another_after_the_lease(redis_url):
    import redis

    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    # No sleeps against the lease: the test waits on Redis's own idle time for the entry. The one span that
    # must stay under the lease is a heartbeat and the claim right after it (two local round trips).
    lease_s = 1.0
    a, b = RedisJobStore(redis_url, lease_s=lease_s), RedisJobStore(redis_url, lease_s=lease_s)
    rec = a.submit({"family": "echo"}, "o", 10)
    job = a.claim("replica-a", 0.1)
    patient = RedisJobStore(redis_url, lease_s=600)
    assert job["id"] == rec["id"] and patient.claim("replica-b", 0.1) is None  # claimed: nobody else gets it

    def idle_s() -> float:
        (entry,) = r.xpending_range("longhaul:jobs", "longhaul-workers", "-", "+", 1)
        return entry["time_since_delivered"] / 1000

    wait_until(lambda: idle_s() >= lease_s, what="the claim to outlast the lease")  # b could take it now ...
    a.heartbeat(job, "replica-a")  # ... but a live worker keeps its claim
    assert b.claim("replica-b", 0.1) is None
    stolen = wait_until(lambda: b.claim("replica-b", 0.1), what="the lease to run out")  # replica-a went silent
    assert stolen["id"] == rec["id"] and stolen["attempts"] == 2
    b.finish(stolen, {"r": 1})
    assert a.get(rec["id"])["status"] == "succeeded" and a.counts()["succeeded"] == 1 and a.counts()["running"] == 0
    c = RedisJobStore(redis_url)  # a restart under the same name re-reads its own pending entries
    rec2 = c.submit({"family": "echo"}, "o", 10)
    assert c.claim("replica-c", 0.1)["id"] == rec2["id"]
    c2 = RedisJobStore(redis_url)
    assert c2.recover("replica-c") == 1 and c2.claim("replica-c", 0.1)["id"] == rec2["id"]
