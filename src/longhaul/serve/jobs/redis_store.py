"""The Redis job store: records in hashes, the queue in a Redis Stream with a consumer group.

`--queue redis://host:port/db` makes every replica share one queue. A job is a hash
`longhaul:job:<id>` (the fields of `store.new_record`, JSON-encoded) plus an entry in the
stream `longhaul:jobs`; status sets `longhaul:jobs:<status>` make counting and the queue bound
O(1). Replicas read the stream as consumers of the group `longhaul-workers` (consumer name:
the replica's name, a pod's hostname by default), so each job goes to one replica. A job
stays in its consumer's pending list until it is acknowledged when it ends; so:
- a replica that restarts under the same name first re-reads its own pending entries
  (`recover`): the jobs it was running when it died run again;
- a replica that never comes back leaves entries that grow idle: any replica claims those
  idle longer than the lease (`XAUTOCLAIM`), while a live worker keeps its job's idle time
  near zero with a heartbeat (`XCLAIM ... JUSTID`).
Needs the `redis` Python package (the `redis` extra). Does not own running episodes.
"""

from __future__ import annotations

import json
import time

from longhaul.errors import LonghaulError
from longhaul.serve.jobs.store import STATUSES, new_record

STREAM, GROUP, PREFIX = "longhaul:jobs", "longhaul-workers", "longhaul:job:"
_JSON_FIELDS = ("spec", "result", "attempts", "created_at", "started_at", "finished_at", "error", "entry")


class RedisJobStore:
    def __init__(self, url: str, lease_s: float = 60.0):
        try:
            import redis
        except ImportError:
            raise LonghaulError("--queue redis://... needs the redis package; pip install 'longhaul[redis]'") from None
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self.lease_ms = int(lease_s * 1000)
        self._backlog: list[tuple[str, str]] = []  # (entry, job id) re-read from our pending list by recover()
        try:
            self.r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        except redis.ConnectionError as e:
            raise LonghaulError(f"cannot reach Redis at {url} ({e}); start it or fix --queue") from None

    # ---- records -------------------------------------------------------------------------
    def _save(self, rec: dict, old_status: str | None = None, pipe=None) -> None:
        p = pipe or self.r.pipeline()
        fields = {k: (json.dumps(v) if k in _JSON_FIELDS else v) for k, v in rec.items() if k != "object"}
        p.hset(PREFIX + rec["id"], mapping=fields)
        if old_status and old_status != rec["status"]:
            p.srem(f"{STREAM}:{old_status}", rec["id"])
        p.sadd(f"{STREAM}:{rec['status']}", rec["id"])
        if pipe is None:
            p.execute()

    def get(self, job_id: str) -> dict | None:
        raw = self.r.hgetall(PREFIX + job_id)
        if not raw:
            return None
        rec = {k: (json.loads(v) if k in _JSON_FIELDS else v) for k, v in raw.items()}
        rec["object"] = "job"
        return rec

    def submit(self, spec: dict, owner: str, max_queued: int) -> dict | None:
        if self.r.scard(f"{STREAM}:queued") >= max_queued:
            return None
        rec = new_record(spec, owner)
        p = self.r.pipeline()  # MULTI/EXEC: the record and its stream entry appear together
        self._save(rec, pipe=p)
        p.xadd(STREAM, {"job": rec["id"]})
        p.execute()
        return rec

    # ---- the queue -----------------------------------------------------------------------
    def _start(self, entry: str, job_id: str) -> dict | None:
        rec = self.get(job_id)
        if rec is None or rec["status"] in ("succeeded", "failed"):  # already done: drop the entry
            self.r.xack(STREAM, GROUP, entry)
            return None
        old = rec["status"]
        rec.update(status="running", attempts=int(rec["attempts"]) + 1, started_at=time.time(), entry=entry)
        self._save(rec, old)
        return rec

    def claim(self, worker: str, timeout: float) -> dict | None:
        while True:
            try:
                item = self._backlog.pop(0)  # workers share the backlog; pop is atomic
            except IndexError:
                break
            if (rec := self._start(*item)) is not None:
                return rec
        _, claimed, *_ = self.r.xautoclaim(STREAM, GROUP, worker, self.lease_ms, "0-0", count=1)
        for entry, fields in claimed:
            if fields and (rec := self._start(entry, fields["job"])) is not None:
                return rec
        got = self.r.xreadgroup(GROUP, worker, {STREAM: ">"}, count=1, block=max(1, int(timeout * 1000)))
        for _, entries in got or []:
            for entry, fields in entries:
                if (rec := self._start(entry, fields["job"])) is not None:
                    return rec
        return None

    def heartbeat(self, job: dict, worker: str) -> None:
        self.r.xclaim(STREAM, GROUP, worker, 0, [job["entry"]], justid=True)

    def _end(self, job: dict, status: str, result: dict | None, error: str | None) -> None:
        rec = {**job, "status": status, "finished_at": time.time(), "result": result, "error": error}
        p = self.r.pipeline()
        self._save(rec, job["status"], pipe=p)
        p.xack(STREAM, GROUP, job["entry"])
        p.xdel(STREAM, job["entry"])
        p.execute()

    def finish(self, job: dict, result: dict) -> None:
        self._end(job, "succeeded", result, None)

    def fail(self, job: dict, error: str) -> None:
        self._end(job, "failed", None, error)

    def release(self, job: dict) -> None:
        """Back to queued; the entry stays pending, so the next claim (ours or, after the
        lease, another replica's) runs it again."""
        self._save({**job, "status": "queued"}, job["status"])
        self._backlog.append((job["entry"], job["id"]))

    def recover(self, worker: str) -> int:
        got = self.r.xreadgroup(GROUP, worker, {STREAM: "0"}, count=10_000) or []
        self._backlog = [(entry, fields["job"]) for _, entries in got for entry, fields in entries if fields]
        return len(self._backlog)

    def counts(self) -> dict[str, int]:
        p = self.r.pipeline()
        for s in STATUSES:
            p.scard(f"{STREAM}:{s}")
        return dict(zip(STATUSES, p.execute()))

    def close(self) -> None:
        self.r.close()
