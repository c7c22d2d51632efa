"""The controller of an online RL run: it reads like one process.

    for step in steps:
        admit()                      # submit the requests the staleness bound now allows
        groups = gather(step)        # finished groups from the replay buffer
        trainer.step(groups)         # one optimizer step: policy version `step`
        rollouts.load_weights(step)  # the new weights flow back to the workers

Rollout workers (`runtime.local` / `runtime.ray_backend`) produce groups into the replay buffer
(`runtime.buffer`) while the trainer works. Admission control holds the version lag: the
request for step j is submitted only once version j - 1 - max_staleness exists, and carries
that as its `min_version`, so no group trains more than `max_staleness` versions after the
weights it started from. With max_staleness 0 every request waits for the previous update,
which is the synchronous run, step for step and bit for bit (tested). `runtime.mode: sync`
runs that same loop with the inline backend.

Dynamic sampling (DAPO): groups whose rewards are all equal are dropped and the step's
request is topped up by refill rounds of further tasks. Resume: every submission is logged
in the buffer's log, so a resumed run reuses the groups finished before a crash (only
unfinished requests run again, with the same tasks and seeds).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import torch

from longhaul.runtime.buffer import Entry, ReplayBuffer, reward_spread
from longhaul.runtime.local import InlineRollouts, ProcessRollouts, ThreadRollouts, trainer_threads
from longhaul.runtime.ray_backend import RayRollouts
from longhaul.runtime.rollout import RolloutRequest, RolloutResult


def buffer_capacity(cfg) -> int:
    refill = 1 + (cfg.algo.max_refill_rounds if cfg.algo.dynamic_sampling else 0)
    s = cfg.runtime.max_staleness if cfg.runtime.mode == "async" else 0
    return cfg.runtime.buffer_capacity or (s + 2) * cfg.rollout.prompts_per_step * refill


def make_rollouts(cfg, family, tok, policy, run_dir):
    if cfg.runtime.mode == "sync":
        return InlineRollouts(cfg, family, tok, policy)
    if cfg.runtime.backend == "ray":
        return RayRollouts(cfg, family, tok, policy, run_dir)
    if cfg.runtime.worker_kind == "thread":
        return ThreadRollouts(cfg, family, tok, policy)
    return ProcessRollouts(cfg, family, tok, policy, run_dir)


class Controller:
    def __init__(self, cfg, source, trainer, rollouts, buffer: ReplayBuffer, policy, epoch: int = 0):
        """source: a `tasks.TaskStream` / `tasks.ScheduledTasks`. epoch: how many times the run was
        resumed (requests of a later epoch get distinct ids: those of an earlier one may be logged)."""
        self.cfg, self.source, self.trainer, self.rollouts, self.buffer, self.policy = cfg, source, trainer, rollouts, buffer, policy
        self.s = cfg.runtime.max_staleness if cfg.runtime.mode == "async" else 0
        self.P = cfg.rollout.prompts_per_step
        self.epoch = epoch
        self.submitted = 0  # requests submitted over the run (a checkpoint's count decides what a resume reuses)
        self.ingested: set[str] = set()  # requests whose results reached the buffer (and the task source)
        self.requests: dict[str, RolloutRequest] = {}  # submitted, not yet finished
        self.finished: dict[str, RolloutResult] = {}  # uid -> result (groups are in the buffer)
        self.next_step = 1  # the next step whose first request is not yet submitted
        self.rounds: Counter = Counter()  # step -> refill rounds submitted
        self.version = 0
        self.inline = not hasattr(rollouts, "inbox")
        self.t0 = time.monotonic()
        self.idle_s = 0.0
        self.consumed = 0
        self._stop = threading.Event()
        self._receiver = None
        self._lock = threading.RLock()  # requests / finished are shared with the receiver thread
        self.full_threads = torch.get_num_threads()
        self.shared_threads = None  # local process workers share this machine's cores with the trainer
        if cfg.runtime.mode == "async" and cfg.runtime.backend == "local" and cfg.runtime.worker_kind == "process":
            self.shared_threads = min(self.full_threads, trainer_threads(cfg))

    # ---- the loop -----------------------------------------------------------------------
    def start(self, start_step: int, resume: dict | None = None) -> None:
        """Start the workers; for a resumed run first pick up the requests the checkpoint knew of
        (`resume`: `checkpoint_state()` as saved): finished ones are reused from the buffer,
        unfinished ones run again with the same tasks and seed, later ones are dropped."""
        self.version, self.next_step = start_step, start_step + 1
        self.t0 = time.monotonic()  # throughput and idle ratios count from here, not from construction
        if resume is not None:
            self._reload(start_step, resume)
        if start_step:  # a resumed run: the workers' weights are version start_step, not 0
            self.rollouts.load_weights(self.policy, start_step)
        self.rollouts.start()
        for req in sorted(self.requests.values(), key=lambda r: (r.step, r.round)):
            self.rollouts.submit(req)
        if not self.inline:
            self._receiver = threading.Thread(target=self._receive, name="rollout-receiver", daemon=True)
            self._receiver.start()

    def _reload(self, start_step: int, state: dict) -> None:
        notes = self.buffer.notes("submit")
        known, later = notes[:state["submitted"]], notes[state["submitted"]:]
        self.submitted, self.ingested = state["submitted"], set(state["ingested"])
        for row in later:  # drawn after the checkpoint: the restored task source will draw afresh
            self.buffer.drop(self.buffer.select(lambda e, u=row["uid"]: e.uid.startswith(u + "/")), start_step)
        for row in known:
            if row["step"] <= start_step:
                continue
            tasks = [self.source.find(d, tid) for d, tid in row["tasks"]]
            req = RolloutRequest(row["step"], row["round"], tasks, row["seed"], row["min_version"],
                                 domains=[d for d, _ in row["tasks"]] if row["tasks"] and row["tasks"][0][0] else None,
                                 epoch=row.get("epoch", 0))
            self.rounds[req.step] = max(self.rounds[req.step], req.round)
            self.next_step = max(self.next_step, req.step + 1)
            have = self.buffer.select(lambda e, u=req.uid: e.uid.startswith(u + "/"))
            if len(have) == len(req.tasks):
                self.finished[req.uid] = None  # finished before the restart; its groups are buffered
                if req.uid not in self.ingested:  # finished after the checkpoint: the source has not seen it
                    self.source.record([e.group for e in sorted(have, key=lambda e: e.index)])
                    self.ingested.add(req.uid)
            else:
                self.buffer.drop(have, start_step)
                self.requests[req.uid] = req

    def checkpoint_state(self) -> dict:
        """What a resume needs besides the trainer: the task source and which requests existed."""
        with self._lock:
            return {"tasks": self.source.state_dict(), "submitted": self.submitted, "ingested": sorted(self.ingested),
                    "epoch": self.epoch}

    def admit(self, last_step: int) -> None:
        """Submit first requests for every step the staleness bound allows now."""
        while self.next_step <= last_step and self.next_step - 1 - self.s <= self.version:
            self._submit(self.next_step, 0, self.P)
            self.next_step += 1

    def _submit(self, step: int, round_: int, n: int) -> bool:
        with self._lock:  # the receiver thread records outcomes into the same source
            drawn = self.source.take(n)
        if not drawn:
            return False
        domains = [d for d, _ in drawn] if drawn[0][0] is not None else None
        req = RolloutRequest(step, round_, [t for _, t in drawn], self.cfg.seed * 1_000_003 + step + 7919 * round_,
                             max(0, step - 1 - self.s), domains=domains, epoch=self.epoch)
        self.submitted += 1
        self.buffer.note({"op": "submit", "uid": req.uid, "step": step, "round": round_, "seed": req.seed, "epoch": self.epoch,
                          "min_version": req.min_version, "tasks": [[d, t.task_id] for d, t in drawn]})
        with self._lock:
            self.requests[req.uid] = req
        self.rollouts.submit(req)
        return True

    def gather(self, step: int) -> tuple[list[list], dict]:
        """This step's groups (waiting for them) and what it took: timings, refills, staleness."""
        t0 = time.monotonic()
        while True:
            with self._lock:
                picked = self._ready(step)
            if picked is not None:
                break
            self._pump()
        entries, info = picked
        self.buffer.take(len(entries), step, select=lambda e, ids={e.uid for e in entries}: e.uid in ids, timeout=0)
        waited = time.monotonic() - t0
        self.idle_s += waited
        self.consumed += sum(len(e.group) for e in entries)
        lag = Counter(max(0, step - 1 - e.version) for e in entries)
        with self._lock:
            results = [r for r in self.finished.values() if r is not None and r.step == step]
            for u in [u for u, r in self.finished.items() if r is None or r.step <= step]:
                del self.finished[u]
        info.update({
            "timing/gen": sum(r.timings["timing/gen"] for r in results),
            "timing/score": sum(r.timings["timing/score"] for r in results),
            "gen_tokens": sum(r.timings["gen_tokens"] for r in results),
            "timing/wait_rollouts": waited,
            "staleness/mean": sum(k * v for k, v in lag.items()) / max(1, len(entries)),
            "staleness/max": max(lag, default=0),
            **{f"staleness/hist_{k}": lag.get(k, 0) for k in range(self.s + 1)},
            "rollout/partial_weight_loads": sum(r.weight_loads for r in results),
        })
        return [e.group for e in entries], info

    def _ready(self, step: int):
        """(entries, info) once the step can be served, else None (maybe after a refill)."""
        cfg = self.cfg
        if cfg.runtime.buffer_order != "fifo" and not cfg.algo.dynamic_sampling:
            fresh = self.buffer.select(lambda e: step - 1 - e.version <= self.s)
            if len(fresh) < self.P:
                return None
            order = ReplayBuffer._ordered(fresh, cfg.runtime.buffer_order)
            return order[:self.P], {}
        mine = [u for u in self.requests if u.split(".")[0] == str(step)]
        if mine:
            return None  # a request of this step is still running
        entries = self.buffer.select(lambda e: e.step == step)
        if not cfg.algo.dynamic_sampling:
            return entries, {}
        varied = [e for e in entries if reward_spread(e.group) > 0]
        rounds = self.rounds[step]
        if len(varied) < self.P and rounds < cfg.algo.max_refill_rounds and self._submit(step, rounds + 1, self.P - len(varied)):
            self.rounds[step] = rounds + 1
            return None
        info = {"dynamic_sampling/groups_sampled": len(entries), "dynamic_sampling/refill_rounds": self.rounds[step]}
        kept = varied[:self.P] or [e for e in entries if e.round == 0]
        self.buffer.drop([e for e in entries if e not in kept], step)
        return kept, info

    def trainer_threads(self) -> int:
        """Torch threads for the next update: the cores the workers leave while they generate,
        every core when nothing is in flight."""
        if self.shared_threads is None:
            return self.full_threads
        with self._lock:
            busy = bool(self.requests)
        return self.shared_threads if busy else self.full_threads

    def publish(self, step: int) -> None:
        self.rollouts.load_weights(self.policy, step)
        self.version = step

    # ---- results ------------------------------------------------------------------------
    def _pump(self) -> None:
        if self.inline:
            self._ingest(self.rollouts.poll())
        else:
            self.buffer.wait_change(0.5)
            if self._receiver is not None and not self._receiver.is_alive() and not self._stop.is_set():
                raise RuntimeError("the rollout receiver stopped; see the error above")

    def _receive(self) -> None:
        while not self._stop.is_set():
            self._ingest(self.rollouts.poll(timeout=0.5))

    def _ingest(self, results: list[RolloutResult]) -> None:
        for res in results:
            for i, group in enumerate(res.groups):
                task_id = group[0].info.get("task_id", str(i)) if group else str(i)
                self.buffer.put(Entry(f"{res.uid}/{i}", res.step, res.round, i, task_id, group, reward_spread(group)))
            with self._lock:
                if res.uid not in self.ingested:  # a requeued request's second result adds nothing
                    self.source.record(res.groups)
                    self.ingested.add(res.uid)
                self.finished[res.uid] = res
                self.requests.pop(res.uid, None)

    def stats(self) -> dict:
        wall = max(1e-9, time.monotonic() - self.t0)
        sync = getattr(self.rollouts, "sync", None)
        out = {"trainer/idle_ratio": self.idle_s / wall, "buffer/groups": len(self.buffer),
               "buffer/versions": len(self.buffer.versions()), "buffer/duplicates_rejected": self.buffer.duplicates_rejected,
               "throughput/trajectories_per_s": self.consumed / wall, **self.rollouts.stats()}
        if sync is not None:
            out.update({"weight_sync/seconds": sync.last_publish_s, "weight_sync/total_seconds": sync.publish_s,
                        "weight_sync/bytes": sync.bytes_published // max(1, sync.publishes)})
        return out

    def close(self) -> None:
        self._stop.set()
        if self._receiver is not None:
            self._receiver.join(timeout=5)
        self.rollouts.close()
        self.buffer.close()
