"""A rollout worker: one sampler (the engine) + the agent loop + sandbox scoring, turning
`RolloutRequest`s into groups of trajectories.

A request is the unit the controller schedules: the tasks of one training step (or of one of
its dynamic-sampling refill rounds), the seed they are sampled with, and the oldest weight
version they may start from (`min_version`, the staleness bound applied at admission). Its
result carries every group, the timings, and which worker ran it. A worker runs one request
at a time; where it lives (this thread, another thread, a child process, a Ray actor) is the
backend's business (`runtime.local`, `runtime.ray_backend`), not this module's.

Weights reach a worker by `load_weights(tensors, version)`, which is safe while a request is
generating: the engine pauses between steps, swaps the weights, re-prefills the sequences in
flight and carries on, recording each token's version (a partial rollout). `WeightWatcher`
does that from a background thread for workers that poll a weight transport.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from longhaul.agent.rollout import rollout_groups
from longhaul.errors import LonghaulError
from longhaul.hardware import resolve_device
from longhaul.inference import LLMEngine, RolloutParams, make_engine
from longhaul.inference.rollout_sampler import merged_state_dict
from longhaul.inference.vllm_engine import VLLMEngine
from longhaul.models.lora import unwrap
from longhaul.models import load_policy
from longhaul.rl.grpo import frozen_copy
from longhaul.runtime.families import build_family, domain_runs
from longhaul.runtime.sandbox_pool import remote_family
from longhaul.types import Trajectory


@dataclass
class RolloutRequest:
    step: int  # the training step these groups are for
    round: int  # 0, or the dynamic-sampling refill round
    tasks: list
    seed: int
    min_version: int  # admission: generation may not start from weights older than this
    domains: list[str] | None = None  # a joint run: each task's domain (None: the run's one family)
    epoch: int = 0  # resumes of the run before this request was made
    attempt: int = 0  # requeues so far

    @property
    def uid(self) -> str:
        return f"{self.step}.{self.round}" + (f"e{self.epoch}" if self.epoch else "")


@dataclass
class RolloutResult:
    uid: str
    step: int
    round: int
    groups: list[list[Trajectory]]
    timings: dict  # timing/gen, timing/score, gen_tokens
    worker: str
    started: float  # time.time() on the worker
    finished: float
    version_start: int  # the worker's weights when the request began
    weight_loads: int = 0  # weight versions loaded while it ran (partial rollouts)
    error: str | None = None  # set when the worker failed on this request


def make_sampler(cfg, policy, tok):
    """What rollouts sample from: the paged engine holding a copy of the policy's weights in
    rollout.dtype on rollout.device (the default), or for rollout.sampler=hf the HF model (a bf16 copy, or the
    policy itself in fp32)."""
    if cfg.rollout.sampler == "engine":
        q = cfg.rollout.quantization
        return make_engine(policy, tok, cfg.rollout.dtype, max_model_len=cfg.model.context_length,
                           quantization=None if q == "none" else q, device=resolve_device(cfg.rollout.device))
    if cfg.rollout.sampler == "vllm":
        if cfg.rollout.quantization != "none":
            raise LonghaulError("rollout.quantization is the built-in engine's; with rollout.sampler vllm leave it none")
        return VLLMEngine(unwrap(policy), tok, cfg.rollout.dtype, max_model_len=cfg.model.context_length, seed=cfg.seed,
                          tensors=merged_state_dict(policy))
    if cfg.rollout.quantization != "none":
        raise LonghaulError(f"rollout.quantization {cfg.rollout.quantization} needs rollout.sampler engine; the HF sampler "
                            f"runs float weights")
    return frozen_copy(policy, torch.bfloat16) if cfg.rollout.dtype == "bfloat16" else policy


def sampling_params(cfg, family) -> RolloutParams:
    return RolloutParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                          top_p=cfg.rollout.top_p, stop=family.stop, batch_size=64)


class RolloutWorker:
    def __init__(self, cfg, family, tok, sampler, name: str = "worker-0", version: int = 0):
        self.cfg, self.family, self.tok, self.sampler, self.name = cfg, family, tok, sampler, name
        self.version = version
        self.params = sampling_params(cfg, family)
        self._domains = None  # a joint run's per-domain families and limits, built on first use
        self._loads = 0
        self._lock = threading.Lock()
        self._link = None  # a sandbox pool that scores and hosts environments for this worker (`sandbox_pool`)

    def use_sandbox_pool(self, link) -> None:
        """Score and run environments in the sandbox pool behind `link` (a `sandbox_pool.PoolLink`)."""
        self._link, self.family = link, remote_family(self.family, link)

    def load_weights(self, tensors: dict, version: int) -> None:
        """Swap in a new policy version; safe to call while `run` is generating (engine samplers)."""
        with self._lock:
            if version <= self.version and self._loads:
                return
            if isinstance(self.sampler, (LLMEngine, VLLMEngine)):
                self.sampler.update_weights(tensors, version, keep_kv=self.cfg.runtime.inflight_kv == "keep")
            else:  # the HF sampler: a plain module copy, loaded between requests only
                self.sampler.load_state_dict(tensors, strict=False)
            self.version = int(version)
            self._loads += 1

    def run(self, req: RolloutRequest) -> RolloutResult:
        cfg = self.cfg
        started, loads0, v0 = time.time(), self._loads, self.version
        lost0 = self._link.lost if self._link else 0
        try:
            if req.domains is None:
                groups, timings = rollout_groups(self.sampler, self.tok, self.family, req.tasks, cfg.rollout.group_size, self.params,
                                                 seed=req.seed, version=self.version, max_turns=cfg.rollout.max_turns,
                                                 max_tokens=cfg.model.context_length, exec_timeout_s=cfg.rollout.exec_timeout_s,
                                                 exec_workers=cfg.rollout.exec_workers, agent=cfg.rollout.agent_options(),
                                                 guidance=cfg.rollout.guidance)
            else:
                groups, timings = self._run_domains(req)
        finally:  # also when the pool's death surfaced as this request's own error
            self._check_pool(req, lost0)
        return RolloutResult(req.uid, req.step, req.round, groups, timings, self.name, started, time.time(), v0, self._loads - loads0)

    def _check_pool(self, req: RolloutRequest, lost0: int) -> None:
        """Fail the request when the sandbox pool died under its episodes, so it is run again
        (as a plain error: the rollout actor itself is fine and must not be replaced)."""
        if self._link is not None and self._link.lost_since(lost0):
            raise LonghaulError(f"the sandbox pool died during request {req.uid}; it is requeued") from None

    def _run_domains(self, req: RolloutRequest) -> tuple[list, dict]:
        """A joint run's request: each domain's tasks with its family, limits and reward shaping;
        groups come back in the request's order, each trajectory tagged with its domain."""
        cfg = self.cfg
        if self._domains is None:
            self._domains = domain_runs(cfg)
            if self._link is not None:
                self._domains = {k: replace(r, family=remote_family(r.family, self._link, k), make_env=None)
                                 for k, r in self._domains.items()}
        by_domain: dict[str, list[int]] = {}
        for i, d in enumerate(req.domains):
            by_domain.setdefault(d, []).append(i)

        def one(k: int, name: str, idx: list[int]):
            run = self._domains[name]
            params = replace(self.params, max_new_tokens=run.max_new_tokens, stop=run.family.stop)
            return rollout_groups(self.sampler, self.tok, run.family, [req.tasks[i] for i in idx], cfg.rollout.group_size, params,
                                  seed=req.seed + 104_729 * k, version=self.version, max_turns=run.max_turns,
                                  max_tokens=cfg.model.context_length, exec_timeout_s=run.exec_timeout_s,
                                  exec_workers=cfg.rollout.exec_workers, make_env=run.make_env, agent=cfg.rollout.agent_options(),
                                  guidance=cfg.rollout.guidance)

        jobs = [(k, name, idx) for k, (name, idx) in enumerate(by_domain.items())]
        t0 = time.perf_counter()
        if isinstance(self.sampler, LLMEngine) and len(jobs) > 1:  # domains side by side: the engine batches them together
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                results = list(pool.map(lambda job: one(*job), jobs))
        else:
            results = [one(*job) for job in jobs]
        groups: list = [None] * len(req.tasks)
        for (_, name, idx), (got, _) in zip(jobs, results):
            run = self._domains[name]
            for i, group in zip(idx, got):
                for traj in group:
                    traj.info.update(domain=name, raw_reward=traj.reward)
                    traj.reward = run.scale * traj.reward + run.offset
                groups[i] = group
        wall = time.perf_counter() - t0
        # overlapping domains: generation was in flight at least as long as the longest domain's
        gen = max(t["timing/gen"] for _, t in results) if len(results) > 1 and isinstance(self.sampler, LLMEngine) \
            else sum(t["timing/gen"] for _, t in results)
        return groups, {"timing/gen": gen, "timing/score": max(0.0, wall - gen), "gen_tokens": sum(t["gen_tokens"] for _, t in results)}


def worker_from_config(cfg, name: str) -> RolloutWorker:
    """A worker built from the config alone (in a child process or an actor): the model, its
    family and its sampler, at version -1 until the first weights arrive."""
    policy, tok = load_policy(cfg.model.name, cfg.model.rope_scaling)
    return RolloutWorker(cfg, build_family(cfg), tok, make_sampler(cfg, policy, tok), name, version=-1)


def infra_failure(req: RolloutRequest, group_size: int, why: str, worker: str = "") -> RolloutResult:
    """What a request that kept failing yields: every episode an infra error (never scored or
    trained on), so the run goes on and says why."""
    groups = [[Trajectory([], 0.0, g, {"task_id": t.task_id, "family": getattr(t, "family", ""), "ended": "infra_error",
                                       "status": "infra_error", "passed": False, "infra_error": why,
                                       **({"domain": req.domains[g]} if req.domains else {})})
               for _ in range(group_size)] for g, t in enumerate(req.tasks)]
    now = time.time()
    return RolloutResult(req.uid, req.step, req.round, groups, {"timing/gen": 0.0, "timing/score": 0.0, "gen_tokens": 0},
                         worker, now, now, -1, 0, error=why)


@dataclass
class WeightWatcher:
    """Polls a weight transport from a daemon thread and loads each newer version into the worker."""
    worker: RolloutWorker
    transport: object
    interval_s: float = 0.05
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "WeightWatcher":
        threading.Thread(target=self._loop, name=f"{self.worker.name}-weights", daemon=True).start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def poll(self) -> bool:
        got = self.transport.fetch(self.worker.version)
        if got is None:
            return False
        self.worker.load_weights(*got)
        return True

    def wait_for(self, version: int, timeout: float = 600.0) -> None:
        """Block until the worker holds at least `version` (admission: never start too stale)."""
        deadline = time.monotonic() + timeout
        while self.worker.version < version:
            if not self.poll():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.worker.name}: weights version {version} did not arrive in {timeout}s")
                time.sleep(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
