"""The Ray backend: rollout workers as Ray actors, weights through the Ray object store.

`RayRollouts` joins a running cluster (`runtime.address: auto`, after `ray start --head`) or
starts a local one, and creates `runtime.workers` rollout actors, each asking for
`runtime.worker_cpus` CPUs (and `worker_memory_gb` of memory when set). An actor builds its
model, family, engine and sandbox scoring once; its `run(request)` is one Ray task, and its
`load_weights(ref, version)` can run beside it (the actor has a thread per request it may run,
plus one), so a new version
reaches generation in flight just as on the local backends. A new version is `ray.put` once by
the trainer's side and every actor reads the same object.

With `runtime.trainer_actor: true` the trainer runs as an actor too (`train_in_actor`): it asks
for `trainer_cpus`, `trainer_gpus` and `trainer_memory_gb`, runs the whole controller (and so
owns the rollout actors it creates) and returns the run's result; this process only waits and
shows the actor's output. A trainer actor that dies (its rollout actors die with it, their
owner being gone) is replaced up to `trainer_restarts` times by one that resumes from the last
checkpoint and the persisted replay buffer, as `longhaul train --resume` would.

Failure handling for rollouts is the pool's (`pool.WorkerPool`): an actor that dies (killed, OOM, its node
lost) fails its task with `RayActorError`; the pool creates a replacement and requeues the
request; finished results were already handed over. Not owned here: scheduling policy across
nodes (placement groups come from `longhaul.placement.ray_mapping`).
"""

from __future__ import annotations

import os
import threading
import time

from longhaul.config import RunConfig
from longhaul.cpus import match_priority, own_priority
from longhaul.errors import LonghaulError
from longhaul.jobqueue.units import placed, placement_spec
from longhaul.malloc import keep_freed_memory
from longhaul.runtime import train
from longhaul.runtime.notice import StopNotice, StopRequested
from longhaul.runtime.pool import WorkerPool, policy_tensors
from longhaul.runtime.progress import console
from longhaul.runtime.rollout import worker_from_config
from longhaul.runtime.sandbox_pool import PoolLink, start_pools
from longhaul.runtime.weights import SyncStats, _cast, nbytes


def _ray():
    try:
        import ray
    except ImportError as e:
        raise LonghaulError("runtime.backend=ray needs Ray: pip install 'longhaul[ray]'") from e
    return ray


def connect(address: str | None, log_to_driver: bool = False):
    """The Ray module, initialised: joined to the cluster at `address` ("auto": the running one), or a local one.
    A run the job queue started joins the queue's cluster and namespace (its placement group is there)."""
    ray = _ray()
    if not ray.is_initialized():
        spec = placement_spec()
        if spec is not None:
            address = address or "auto"
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=log_to_driver, ignore_reinit_error=True,
                     namespace=spec["namespace"] if spec else None)
        except ConnectionError as e:
            raise LonghaulError(f"no Ray cluster at runtime.address={address!r}: start one with `ray start --head` "
                                f"or leave runtime.address unset to start a local one") from e
    return ray


class _TrainerActor:
    """Runs in the trainer actor's process: one whole `longhaul train` run."""

    def __init__(self, threads: int, nice: int):
        match_priority(nice)
        import torch

        keep_freed_memory()
        torch.set_num_threads(threads)

    def pid(self) -> int:
        return os.getpid()

    def run(self, cfg_json: str, resume: bool) -> dict:

        return train(RunConfig.model_validate_json(cfg_json), resume)

    def stop(self, name: str) -> int:
        """The driver got a stop notice: the run saves after its step and ends (`runtime.notice`)."""
        return StopNotice.deliver(name)


def train_in_actor(cfg, resume: bool = False, on_start=None) -> dict:
    """Run training in a Ray actor; replace it, resuming, when it dies, unless this process was
    told to stop (then the stop ends the run). `on_start(actor)` sees each one."""
    rt = cfg.runtime
    ray = connect(rt.address, log_to_driver=True)
    inner = cfg.model_copy(update={"runtime": rt.model_copy(update={"trainer_actor": False})}).model_dump_json()
    opts = {"num_cpus": rt.trainer_cpus, "num_gpus": rt.trainer_gpus, "max_restarts": 0, "max_concurrency": 2}  # run + pid / stop
    if rt.trainer_memory_gb:
        opts["memory"] = int(rt.trainer_memory_gb * 2**30)
    cls = ray.remote(**opts)(_TrainerActor)
    threads = cfg.threads or max(1, int(rt.trainer_cpus))
    with StopNotice() as notice:  # one for every attempt: a stop is not forgotten by a restart
        return _attempts(ray, cls, threads, inner, resume, notice, rt, on_start)


def _attempts(ray, cls, threads: int, inner: str, resume: bool, notice, rt, on_start) -> dict:

    attempt = 0
    while True:
        actor = cls.options(**placed("trainer", 0)).remote(threads, own_priority())
        if on_start is not None:
            on_start(actor)
        try:
            result = ray.get(_wait_forwarding_notice(ray, actor, actor.run.remote(inner, resume), notice))
            return {**result, "trainer_restarts": attempt}
        except ray.exceptions.RayActorError as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if notice.received:  # told to stop: the node is going away, so no new actor
                raise StopRequested(f"{notice.received} received: the trainer actor died while stopping ({why}); its last "
                                    f"checkpoint is intact; run the same `longhaul train` command with --resume") from None
            if attempt == rt.trainer_restarts:
                raise LonghaulError(f"the trainer actor died {attempt + 1} time(s), last: {why}; see the Ray logs "
                                    f"(/tmp/ray/session_latest/logs) or raise runtime.trainer_restarts") from None
            console.print(f"[yellow]the trainer actor died ({why}); a new one resumes from the last checkpoint[/]")
            resume, attempt = True, attempt + 1
        except ray.exceptions.RayTaskError as e:  # the run itself failed: its own error, as in-process
            cause = getattr(e, "cause", None)
            if isinstance(cause, LonghaulError):  # its own type: a stop keeps its exit status and label
                raise cause.with_traceback(None) from None
            raise
        finally:
            try:
                ray.kill(actor)
            except Exception:
                pass


def _wait_forwarding_notice(ray, actor, ref, notice):
    """Wait for the actor's run; a stop notice this process gets (SIGTERM, SIGUSR1) goes on to it,
    again until the run's loop has heard it (one that is still setting up has no notice open yet).
    An actor that died answers through `ref`."""
    told = None  # the pending stop call
    while not ray.wait([ref], timeout=0.5)[0]:
        if notice.received and (told is None or (ray.wait([told], timeout=0)[0] and _heard(ray, told) == 0)):
            told = actor.stop.remote(notice.received)
    return ref


def _heard(ray, told) -> int:
    """How many notices the actor's stop call reached (-1: the actor is gone)."""
    try:
        return ray.get(told)
    except ray.exceptions.RayActorError:
        return -1


class _RolloutActor:
    """Runs in the actor's process: one RolloutWorker."""

    def __init__(self, cfg_json: str, wid: int, threads: int | None, nice: int, sandbox_pool=None):
        match_priority(nice)
        import torch

        keep_freed_memory()

        if threads:
            torch.set_num_threads(threads)
        self.cfg = RunConfig.model_validate_json(cfg_json)
        self.worker = worker_from_config(self.cfg, f"ray-{wid}")
        if sandbox_pool is not None:
            self.worker.use_sandbox_pool(PoolLink(sandbox_pool))
        self._cond = threading.Condition()

    def pid(self) -> int:
        return os.getpid()

    def load_weights(self, tensors: dict, version: int) -> int:
        self.worker.load_weights(tensors, version)  # Ray resolves the object ref argument before the call
        with self._cond:
            self._cond.notify_all()
        return self.worker.version

    def run(self, req):
        with self._cond:  # admission: wait for the weights the request may start from
            if not self._cond.wait_for(lambda: self.worker.version >= req.min_version, timeout=600):
                raise TimeoutError(f"weights version {req.min_version} did not reach {self.worker.name}")
        return self.worker.run(req)


class RayRollouts(WorkerPool):
    def __init__(self, cfg, family, tok, policy, run_dir=None):
        super().__init__(cfg, cfg.runtime.workers)
        ray = self.ray = connect(cfg.runtime.address)
        import torch

        self._dtype = torch.bfloat16 if cfg.rollout.dtype == "bfloat16" else None
        opts = {"num_cpus": cfg.runtime.worker_cpus, "max_concurrency": self.capacity + 1, "max_restarts": 0}  # requests + a weight load
        if cfg.runtime.worker_memory_gb:
            opts["memory"] = int(cfg.runtime.worker_memory_gb * 2**30)
        self._cls = ray.remote(**opts)(_RolloutActor)
        self._cfg_json = cfg.model_dump_json()
        self._actors: dict[int, object] = {}
        self._dead: set[int] = set()
        self.sync = SyncStats()
        self._weights = None  # (object ref, version) of the newest publish
        self._publish(policy, 0)

        self.sandbox_pools = start_pools(ray, cfg)  # [] unless runtime.sandbox_pools: scoring stays in the rollout actors

    def _publish(self, policy, version: int) -> None:

        t0 = time.perf_counter()
        tensors = _cast(policy_tensors(policy), self._dtype)
        self._weights = (self.ray.put(tensors), version)
        self.sync.published(nbytes(tensors), time.perf_counter() - t0)

    def load_weights(self, policy, version: int) -> None:
        self._publish(policy, version)
        ref, v = self._weights
        with self._lock:
            for wid, actor in self._actors.items():
                if wid in self._live:
                    actor.load_weights.remote(ref, v)

    def _spawn(self, wid: int) -> None:
        pools = self.sandbox_pools
        actor = self._cls.options(**placed("rollout", wid)).remote(self._cfg_json, wid, self.cfg.runtime.worker_threads, own_priority(),
                                 pools[wid % len(pools)] if pools else None)
        self._actors[wid] = actor
        ref, v = self._weights
        ready = actor.load_weights.remote(ref, v)
        self._watch(wid, ready, "ready")

    def _send(self, wid: int, req) -> None:
        self._watch(wid, self._actors[wid].run.remote(req), "result", req.uid)

    def _watch(self, wid: int, fut, kind: str, uid: str | None = None) -> None:
        """Wait for a task in a thread; a dead actor is left for the pool's health check."""
        def wait():
            ray = self.ray
            try:
                value = ray.get(fut)
            except ray.exceptions.RayActorError:
                self._dead.add(wid)
                return
            except Exception as e:  # the request itself failed (a RayTaskError wrapping it)
                self.inbox.put(("error", wid, (uid, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")))
                return
            self.inbox.put((kind, wid, None if kind == "ready" else value))

        threading.Thread(target=wait, name=f"ray-{kind}-{wid}", daemon=True).start()

    def _alive(self, wid: int) -> bool:
        return wid not in self._dead

    def _kill(self, wid: int) -> None:
        actor = self._actors.pop(wid, None)
        if actor is not None:
            try:
                self.ray.kill(actor)
            except Exception:
                pass

    def stats(self) -> dict:
        out = super().stats()
        if self.sandbox_pools:
            got = []
            for p in self.sandbox_pools:
                try:
                    got.append(self.ray.get(p.stats.remote(), timeout=10))
                except Exception:  # restarting after a death: its counts start again
                    pass
            out.update({"sandbox/scored": sum(g["scored"] for g in got), "sandbox/episodes": sum(g["episodes"] for g in got),
                        "sandbox/open_envs": sum(g["open_envs"] for g in got), "sandbox/pools_answering": len(got)})
        return out

    def close(self) -> None:
        super().close()
        for p in self.sandbox_pools:
            try:
                self.ray.kill(p)
            except Exception:
                pass
        self.sandbox_pools = []

    def actor_pids(self) -> dict[int, int]:
        with self._lock:
            live = {wid: a for wid, a in self._actors.items() if wid in self._live}
        return {wid: self.ray.get(a.pid.remote()) for wid, a in live.items()}
