"""The rollout pool: dispatches requests to workers, collects results, survives failures.

`WorkerPool` is the part every backend shares: a queue of pending requests ordered by (step,
round) so the oldest step is always served first; one request at a time per worker; a worker
that dies (its process exits, its actor is killed) or overruns `request_timeout_s` (a hung
episode) is replaced and its request requeued; a request that fails `max_retries` times
comes back as infra-error episodes, which the trainer neither scores nor trains on. Finished
results are never lost to a failure of a worker: a worker hands a result over whole, and only
unfinished requests are requeued.

A backend subclasses it with four methods: `_spawn(wid)`, `_send(wid, request)`,
`_alive(wid)` and `_kill(wid)`, and puts ("ready" | "result" | "error", wid, payload) messages
on `self.inbox`. The pool's public face is what the controller calls: `submit`, `poll`,
`load_weights`, `close`, `stats`.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from abc import ABC, abstractmethod

from longhaul.errors import LonghaulError
from longhaul.inference.rollout_sampler import merged_state_dict
from longhaul.runtime.rollout import RolloutRequest, RolloutResult, infra_failure


def policy_tensors(policy) -> dict:
    """The policy's HF-named weights (LoRA merged), each storage once (tied embeddings share one)."""
    out, seen = {}, set()
    for name, t in merged_state_dict(policy).items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[name] = t
    return out


def worker_inflight(cfg) -> int:
    """Requests one worker runs at once: every step the staleness bound admits (async), one (sync).
    Concurrent requests share the worker's engine, so its decode batches stay full."""
    rt = cfg.runtime
    if rt.worker_inflight is not None:
        return rt.worker_inflight
    return 1 + rt.max_staleness if rt.mode == "async" else 1


class WorkerPool(ABC):
    def __init__(self, cfg, n_workers: int):
        self.cfg = cfg
        self.n = n_workers
        self.capacity = worker_inflight(cfg)
        self.inbox: queue.Queue = queue.Queue()
        self._pending: list = []  # heap of (step, round, seq, request)
        self._seq = 0
        self._running: dict[str, tuple[int, RolloutRequest, float]] = {}  # uid -> (worker id, request, monotonic start)
        self._load: dict[int, int] = {}  # worker id -> requests running on it
        self._ready: set[int] = set()  # workers that said they can serve
        self._live: set[int] = set()
        self._busy_since: dict[int, float] = {}
        self._spawned_at: dict[int, float] = {}  # worker id -> when it was started, until it says ready
        self.start_s: list[float] = []  # start-up time of each worker that became ready (spawn to ready)
        self._next_wid = 0
        self.t0 = time.monotonic()
        self.busy_s = 0.0  # worker-seconds with at least one request running
        self.restarts = 0
        self.requeued = 0
        self.failed_requests = 0
        self._start_failures = 0
        self._given_up: list[RolloutResult] = []  # requests that failed for good, as infra-error results
        self._lock = threading.RLock()  # the controller submits while the receiver thread polls

    # ---- controller side ------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers (once: a second call finds them started)."""
        with self._lock:
            if self._next_wid:
                return
            for _ in range(self.n):
                self._new_worker()

    def submit(self, req: RolloutRequest) -> None:
        with self._lock:
            self._seq += 1
            heapq.heappush(self._pending, (req.step, req.round, self._seq, req))
            self._dispatch()

    def poll(self, timeout: float | None = None) -> list[RolloutResult]:
        """Results finished since the last call; waits up to `timeout` for at least one (None: forever).
        Safe to call from one thread while another submits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RolloutResult] = []
        while True:
            with self._lock:
                out += self._given_up
                self._given_up = []
                self._check_health()
                self._dispatch()
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            try:
                msg = self.inbox.get(timeout=wait)
            except queue.Empty:
                msg = None
            with self._lock:
                while msg is not None:
                    res = self._handle(*msg)
                    if res is not None:
                        out.append(res)
                    try:
                        msg = self.inbox.get_nowait()
                    except queue.Empty:
                        msg = None
                if out or (deadline is not None and time.monotonic() >= deadline):
                    self._dispatch()
                    return out

    @property
    def outstanding(self) -> int:
        return len(self._pending) + len(self._running)

    def stats(self) -> dict:
        now = time.monotonic()
        wall = max(1e-9, now - self.t0)
        busy = self.busy_s + sum(now - t for t in self._busy_since.values())
        return {"rollout/idle_ratio": max(0.0, 1.0 - busy / (wall * self.n)), "rollout/pending_requests": len(self._pending),
                "rollout/running_requests": len(self._running), "rollout/worker_restarts": self.restarts,
                "rollout/requeued_requests": self.requeued, "rollout/failed_requests": self.failed_requests,
                "rollout/worker_start_s": sum(self.start_s) / len(self.start_s) if self.start_s else 0.0}

    def close(self) -> None:
        with self._lock:
            for wid in list(self._live):
                self._kill(wid)
            self._live.clear()

    # ---- bookkeeping ----------------------------------------------------------------------
    def _new_worker(self) -> int:
        wid = self._next_wid
        self._next_wid += 1
        self._live.add(wid)
        self._load[wid] = 0
        self._spawned_at[wid] = time.monotonic()
        self._spawn(wid)
        return wid

    def _dispatch(self) -> None:
        while self._pending:
            free = [w for w in self._ready if self._load[w] < self.capacity]
            if not free:
                return
            wid = min(free, key=lambda w: (self._load[w], w))
            req = heapq.heappop(self._pending)[3]
            now = time.monotonic()
            self._running[req.uid] = (wid, req, now)
            if self._load[wid] == 0:
                self._busy_since[wid] = now
            self._load[wid] += 1
            self._send(wid, req)

    def _finish(self, uid: str) -> RolloutRequest | None:
        """Take a request off its worker's books; returns it (None if it was not running)."""
        got = self._running.pop(uid, None)
        if got is None:
            return None
        wid, req, _ = got
        self._load[wid] -= 1
        if self._load[wid] == 0 and wid in self._busy_since:
            self.busy_s += time.monotonic() - self._busy_since.pop(wid)
        return req

    def _handle(self, kind: str, wid: int, payload) -> RolloutResult | None:
        """Messages: ("ready", wid, None), ("result", wid, RolloutResult), ("error", wid, (uid or None, text))."""
        if wid not in self._live:
            return None  # a replaced worker's last words
        if kind == "ready":
            self._ready.add(wid)
            if wid in self._spawned_at:
                self.start_s.append(time.monotonic() - self._spawned_at.pop(wid))
            return None
        if kind == "result":
            self._finish(payload.uid)
            return payload
        uid, why = payload
        if uid is None:  # it failed before it could serve: replace it, a few times at most
            self._start_failures += 1
            if self._start_failures > self.cfg.runtime.max_retries:
                raise LonghaulError(f"rollout workers failed to start {self._start_failures} times; last: {why}")
            self._drop_worker(wid)
            self._new_worker()
            return None
        req = self._finish(uid)
        return self._retry(req, why) if req is not None else None

    def _retry(self, req: RolloutRequest, why: str) -> RolloutResult | None:
        if req.attempt >= self.cfg.runtime.max_retries:
            self.failed_requests += 1
            return infra_failure(req, self.cfg.rollout.group_size, f"request {req.uid} failed {req.attempt + 1} times; last: {why}")
        req.attempt += 1
        self.requeued += 1
        self.submit(req)
        return None

    def _drop_worker(self, wid: int) -> list[RolloutRequest]:
        """Kill a worker and forget it; returns the requests it was running."""
        self._kill(wid)
        self._live.discard(wid)
        self._ready.discard(wid)
        lost = [uid for uid, (w, _, _) in self._running.items() if w == wid]
        return [r for r in (self._finish(uid) for uid in lost) if r is not None]

    def _check_health(self) -> None:
        now = time.monotonic()
        for wid in list(self._live):
            hung = any(w == wid and now - t > self.cfg.runtime.request_timeout_s for w, _, t in self._running.values())
            if self._alive(wid) and not hung:
                continue
            why = f"worker {wid} {'overran request_timeout_s' if hung else 'died'}"
            self.restarts += 1
            for req in self._drop_worker(wid):
                res = self._retry(req, why)
                if res is not None:
                    self._given_up.append(res)
            self._new_worker()

    # ---- backend hooks --------------------------------------------------------------------
    def training(self, busy: bool) -> None:
        """The trainer starts (True) or ends (False) an update: backends that share cores with it may adapt."""

    @abstractmethod
    def load_weights(self, policy, version: int) -> None:
        """Publish `policy` as `version` to every worker."""

    @abstractmethod
    def _spawn(self, wid: int) -> None:
        """Start worker `wid`; it puts ("ready", wid, None) in the inbox once it can serve."""

    @abstractmethod
    def _send(self, wid: int, req: RolloutRequest) -> None:
        """Hand `req` to worker `wid`."""

    @abstractmethod
    def _alive(self, wid: int) -> bool:
        """Whether worker `wid`'s process, thread or actor still runs."""

    @abstractmethod
    def _kill(self, wid: int) -> None:
        """Stop worker `wid` (a no-op when it is gone)."""
