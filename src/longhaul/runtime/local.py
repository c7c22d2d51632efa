"""The local backends: rollout workers in this process or in its children.

- `InlineRollouts` runs each request in the caller's thread when results are polled, and loads
  weights by direct copy: the synchronous run, and the reference every other backend must match.
- `ThreadRollouts`: workers are threads of this process, each with its own engine; weights go
  through `InProcessWeights` (one copy a version) and reach generation in flight.
- `ProcessRollouts`: workers are spawned child processes, each loading the model, its family and
  its engine once; weights go through shared memory (or files); requests travel over a queue
  and results over the child's own pipe. A child that dies or hangs is replaced by the pool.
  Cores are shared, not oversubscribed: a child steps on `worker_threads` threads while the
  trainer updates and on every core otherwise; the trainer keeps the rest (controller).

Every worker runs up to `pool.worker_inflight` requests at once on its one engine, so the
decode batch of an asynchronous run stays full across steps.

Not owned here: dispatch, requeue and failure policy (`pool.WorkerPool`), the Ray backend.
"""

from __future__ import annotations

import queue
import threading
import traceback

from longhaul.config import RunConfig
from longhaul.cpus import available_cpus
from longhaul.inference.engine import LLMEngine
from longhaul.malloc import bound_free_heap, free_limit, keep_freed_memory
from longhaul.rl.grpo import frozen_copy
from longhaul.runtime.notice import leave_to_the_parent
from longhaul.runtime.pool import WorkerPool, policy_tensors
from longhaul.runtime.rollout import (
    RolloutRequest,
    RolloutResult,
    RolloutWorker,
    WeightWatcher,
    make_sampler,
    worker_from_config,
)
from longhaul.runtime.weights import (
    FileWeights,
    InProcessWeights,
    SharedMemoryWeights,
    SyncStats,
)


def worker_threads(cfg) -> int:
    """Torch threads of each local process worker (see runtime.worker_threads)."""
    rt = cfg.runtime
    return rt.worker_threads or max(1, available_cpus() // (rt.workers + 1))


def trainer_threads(cfg) -> int:
    """Threads the trainer keeps while local process workers generate: the cores they leave."""
    return max(1, available_cpus() - cfg.runtime.workers * worker_threads(cfg))


class InlineRollouts:
    """One worker, no concurrency: `poll` runs the oldest pending request to completion."""

    def __init__(self, cfg, family, tok, policy):
        self.cfg, self.policy = cfg, policy
        self.sampler = make_sampler(cfg, policy, tok)
        self.worker = RolloutWorker(cfg, family, tok, self.sampler, "inline")
        self.sync = SyncStats()
        self._pending: list[RolloutRequest] = []
        self.busy_s = 0.0
        self.kv_slept = 0  # bytes of KV pool the engine handed back at the last update

    def start(self) -> None:
        pass

    def submit(self, req: RolloutRequest) -> None:
        self._pending.append(req)

    def poll(self, timeout: float | None = None) -> list[RolloutResult]:
        if not self._pending:
            return []
        self._pending.sort(key=lambda r: (r.step, r.round))
        res = self.worker.run(self._pending.pop(0))
        self.busy_s += res.finished - res.started
        return [res]

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def load_weights(self, policy, version: int) -> None:
        import time

        t0 = time.perf_counter()
        if self.sampler is policy:  # the HF sampler in fp32 is the policy itself
            self.worker.version = version
            return
        tensors = policy_tensors(policy)
        self.worker.load_weights(tensors, version)
        self.sync.published(sum(t.numel() * t.element_size() for t in tensors.values()), time.perf_counter() - t0)

    def stats(self) -> dict:
        return {"rollout/pending_requests": len(self._pending), "memory/kv_slept_gb": round(self.kv_slept / 1e9, 4)}

    def training(self, busy: bool) -> None:
        """While the trainer updates, the engine's KV pool hands its pages back (`LLMEngine.sleep`):
        rollouts here run only between updates, so the pool idles through every update. After the
        update, the allocator's free pages (the update's freed buffers, idle until the next one)
        go back too when they and the pool's pages, about to return, would pass the free-heap
        bound (`malloc.free_limit`): one phase's memory at a time, not both."""
        if busy and isinstance(self.sampler, LLMEngine):
            self.kv_slept = self.sampler.sleep()
        elif not busy and self.kv_slept:
            limit = free_limit()
            if limit is not None:
                bound_free_heap(max(0, limit - self.kv_slept))

    def close(self) -> None:
        pass


def _serve(make_worker, transport, wid: int, send, box, stop=None, capacity: int = 1, step_hook=None) -> None:
    """A worker's life, in a thread or a child process: build it, report ready, then run the
    requests that arrive in `box` (at most `capacity` at once, each in its own thread, all on the
    one engine, after waiting for the weights each may start from) until a None arrives.
    `send(msg)` hands a message to the pool."""
    try:
        worker = make_worker()
        if step_hook is not None:
            worker.sampler.step_hook = step_hook
        watcher = WeightWatcher(worker, transport)
        watcher.wait_for(0)
        if worker.cfg.runtime.partial_rollouts:
            watcher.start()
    except Exception as e:
        send(("error", wid, (None, f"worker start: {type(e).__name__}: {e}")))
        return

    def run(req) -> None:
        try:
            watcher.wait_for(req.min_version)
            send(("result", wid, worker.run(req)))
        except Exception as e:
            send(("error", wid, (req.uid, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")))

    send(("ready", wid, None))
    threads = []
    while stop is None or not stop.is_set():
        req = box.get()
        if req is None:
            break
        threads = [t for t in threads if t.is_alive()]
        th = threading.Thread(target=run, args=(req,), name=f"{worker.name}-{req.uid}", daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    watcher.stop()


class _TransportPool(WorkerPool):
    """Workers fed through per-worker request boxes, weights through `self.transport`."""
    transport = None
    _boxes: dict

    @property
    def sync(self) -> SyncStats:
        return self.transport.stats

    def load_weights(self, policy, version: int) -> None:
        self.transport.publish(policy_tensors(policy), version)

    def _send(self, wid: int, req: RolloutRequest) -> None:
        self._boxes[wid].put(req)


class ThreadRollouts(_TransportPool):
    def __init__(self, cfg, family, tok, policy):
        super().__init__(cfg, cfg.runtime.workers)
        self.family, self.tok, self.policy = family, tok, policy
        import torch

        self.transport = InProcessWeights(torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else None)
        self.transport.publish(policy_tensors(policy), 0)
        self._boxes: dict[int, queue.Queue] = {}
        self._stop: dict[int, threading.Event] = {}

    def _make_worker(self, wid: int) -> RolloutWorker:

        own = self.policy if self.cfg.rollout.sampler == "engine" else frozen_copy(self.policy)  # the engine copies weights itself
        return RolloutWorker(self.cfg, self.family, self.tok, make_sampler(self.cfg, own, self.tok), f"thread-{wid}", version=-1)

    def _spawn(self, wid: int) -> None:
        box, stop = queue.Queue(), threading.Event()
        self._boxes[wid], self._stop[wid] = box, stop
        threading.Thread(target=_serve, args=(lambda: self._make_worker(wid), self.transport, wid, self.inbox.put, box, stop,
                                              self.capacity), name=f"rollout-{wid}", daemon=True).start()

    def _alive(self, wid: int) -> bool:
        return not self._stop[wid].is_set()

    def _kill(self, wid: int) -> None:  # a thread cannot be killed: it is told to stop after its request
        self._stop[wid].set()
        self._boxes[wid].put(None)


def _child_main(cfg_json: str, wid: int, transport, conn, box, threads: int, capacity: int, trainer_busy) -> None:
    """A process worker: everything is built from the config inside the child. Results go back
    over this worker's own pipe (a worker killed mid-send breaks only its own channel). While
    `trainer_busy` is set the engine steps on `threads` torch threads, else on every core."""
    import os

    import torch

    keep_freed_memory()
    leave_to_the_parent()
    cores = available_cpus()
    torch.set_num_threads(threads)
    lock = threading.Lock()

    def send(msg) -> None:
        with lock:  # several request threads share the pipe
            conn.send(msg)

    wanted = [threads]

    def hook() -> None:  # runs in the stepping thread: torch's thread count is per thread
        n = threads if trainer_busy.value else cores
        if n != wanted[0]:  # only on a change: the engine's governor may have set fewer, and switching is costly
            wanted[0] = n
            torch.set_num_threads(n)

    cfg = RunConfig.model_validate_json(cfg_json)
    _serve(lambda: worker_from_config(cfg, f"process-{wid}"), transport, wid, send, box, capacity=capacity, step_hook=hook)
    # everything it owed is sent: leave without the interpreter's teardown, which aborts
    # ("terminate called without an active exception") on the native threads still parked
    conn.close()
    os._exit(0)


class ProcessRollouts(_TransportPool):
    def __init__(self, cfg, family, tok, policy, run_dir=None):
        super().__init__(cfg, cfg.runtime.workers)
        import torch
        import torch.multiprocessing as mp

        self.ctx = mp.get_context("spawn")
        dtype = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else None
        tensors = policy_tensors(policy)
        if cfg.runtime.weight_sync == "files":
            if run_dir is None:
                raise ValueError("weight_sync=files needs the run directory")
            self.transport = FileWeights(run_dir / "weights", dtype)
        else:
            self.transport = SharedMemoryWeights(tensors, dtype)
        self.transport.publish(tensors, 0)
        self._procs: dict[int, object] = {}
        self._boxes: dict[int, object] = {}
        self._cfg_json = cfg.model_dump_json()
        self.threads = worker_threads(cfg)
        self.trainer_busy = self.ctx.Value("b", 0)  # set while the trainer updates: workers then keep to `threads`

    def training(self, busy: bool) -> None:
        self.trainer_busy.value = int(busy)

    def _spawn(self, wid: int) -> None:
        box = self.ctx.Queue()
        recv, send = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=_child_main, name=f"longhaul-rollout-{wid}", daemon=True,
                             args=(self._cfg_json, wid, self.transport, send, box, self.threads, self.capacity, self.trainer_busy))
        p.start()
        send.close()  # the child holds the sending end; EOF here means it is gone
        self._procs[wid], self._boxes[wid] = p, box
        threading.Thread(target=self._forward, args=(recv,), name=f"rollout-{wid}-results", daemon=True).start()

    def _forward(self, recv) -> None:
        """Move one child's messages into the pool's inbox until its pipe closes."""
        while True:
            try:
                msg = recv.recv()
            except (EOFError, OSError):  # the child exited or was killed (mid-send included)
                break
            self.inbox.put(msg)
        recv.close()

    def _alive(self, wid: int) -> bool:
        return self._procs[wid].is_alive()

    def _kill(self, wid: int) -> None:
        p = self._procs.get(wid)
        if p is None:
            return
        if p.is_alive():
            self._boxes[wid].put(None)
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)

    @property
    def pids(self) -> dict[int, int]:
        return {wid: p.pid for wid, p in self._procs.items() if wid in self._live}
