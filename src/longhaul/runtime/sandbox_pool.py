"""Sandbox pools as Ray actors: scoring and agent-episode environments in their own processes.

With `runtime.sandbox_pools: N` on the Ray backend, the rollout actors keep only the model,
the engine and the agent loop; every sandbox the run needs (a verifier executing a reply,
the workspace of a multi-turn episode) lives in one of N `SandboxPool` actors, each asking
for `sandbox_cpus` CPUs (and `sandbox_memory_gb`). On a cluster this puts the CPU-heavy
sandboxes on CPU nodes and leaves GPU nodes to generation. Rollout actor k uses pool k mod N.

What a rollout actor sees is its usual family with two members replaced (`remote_family`):
`score_many` sends the tasks and replies to the pool, and `make_env` returns a `RemoteEnv`,
whose `reset` / `step` / `verify` / `close` run on an environment the pool holds. The pool
builds its families from the run's config, exactly as a rollout worker would, so a reply is
scored the same way wherever it runs (tested: the same episodes give the same trajectories).

Failures: a pool actor is restarted by Ray when it dies (`max_restarts=-1`); calls in flight
fail. `PoolLink` counts such failures, and a rollout request that overlapped one is failed
as a whole (`lost_since`), so the rollout pool requeues it rather than training on episodes
that a dead sandbox cut short (`pool.WorkerPool`). Not owned here: the sandbox itself
(`longhaul.sandbox`), the families' verifiers (`longhaul.envs`).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace

from longhaul.config import RunConfig
from longhaul.cpus import match_priority, own_priority
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.jobqueue.units import placed
from longhaul.runtime.families import build_family, domain_runs


class SandboxPool:
    """Runs in a pool actor's process: the run's families, and the environments of the episodes in flight."""

    def __init__(self, cfg_json: str, nice: int):
        match_priority(nice)  # first: its sandboxes' commands inherit it
        cfg = RunConfig.model_validate_json(cfg_json)
        if cfg.domains:  # domain -> (family, its sandbox override)
            self._families = {key: (run.family, run.make_env) for key, run in domain_runs(cfg).items()}
        else:
            self._families = {None: (build_family(cfg), None)}
        self._envs: dict[int, object] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.scored = 0
        self.episodes = 0

    def pid(self) -> int:
        import os

        return os.getpid()

    def _family(self, domain: str | None):
        if domain not in self._families:
            raise LonghaulError(f"sandbox pool has no domain {domain!r}; it knows {sorted(map(str, self._families))}")
        return self._families[domain]

    def score(self, domain: str | None, tasks: list, replies: list[str], kwargs: dict) -> list:
        family, _ = self._family(domain)
        scores = family.score_many(tasks, replies, **kwargs)
        with self._lock:
            self.scored += len(replies)
        return scores

    def open(self, domain: str | None, task) -> int:
        """A new environment for `task` (the family's, or the domain's sandbox override); returns its id."""
        family, make_env = self._family(domain)
        env = (make_env or family.make_env or (lambda t: WorkspaceEnv()))(task)
        with self._lock:
            env_id = next(self._ids)
            self._envs[env_id] = env
            self.episodes += 1
        return env_id

    def call(self, env_id: int, method: str, args: tuple):
        if method not in ("reset", "step", "verify", "tools"):
            raise LonghaulError(f"sandbox pool: {method!r} is not an environment method")
        env = self._envs.get(env_id)
        if env is None:
            raise LonghaulError(f"sandbox pool: no environment {env_id} (closed, or the pool restarted)")
        return getattr(env, method)(*args)

    def close(self, env_id: int) -> None:
        env = self._envs.pop(env_id, None)
        if env is not None:
            env.close()

    def stats(self) -> dict:
        return {"scored": self.scored, "episodes": self.episodes, "open_envs": len(self._envs)}


class PoolLink:
    """A rollout actor's handle on its sandbox pool. Counts calls that failed because the pool
    died (`lost`); after one, the next call first waits for Ray to bring the pool back."""

    def __init__(self, actor, restart_wait_s: float = 120.0):
        import ray

        self.actor, self.ray, self.restart_wait_s = actor, ray, restart_wait_s
        self.lost = 0
        self._down = False
        self._lock = threading.Lock()

    def call(self, method: str, *args):
        if self._down:
            self._wait_up()
        try:
            return self.ray.get(getattr(self.actor, method).remote(*args))
        except self.ray.exceptions.RayActorError:  # died under the call, or is restarting
            with self._lock:
                self.lost += 1
                self._down = True
            raise

    def _wait_up(self) -> None:
        deadline = time.monotonic() + self.restart_wait_s
        while True:
            try:
                self.ray.get(self.actor.pid.remote(), timeout=10)
                self._down = False
                return
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise LonghaulError(f"the sandbox pool did not come back within {self.restart_wait_s:.0f} s of dying; "
                                        f"see the Ray logs (/tmp/ray/session_latest/logs)") from None
                time.sleep(0.5)

    def lost_since(self, mark: int) -> bool:
        return self.lost > mark


class RemoteEnv:
    """The Env protocol over an environment held by a sandbox pool."""

    def __init__(self, link: PoolLink, domain: str | None, task):
        self.link, self.domain = link, domain
        self.env_id = link.call("open", domain, task)

    def _call(self, method: str, *args):
        return self.link.call("call", self.env_id, method, args)

    def tools(self) -> list[dict]:
        return self._call("tools")

    def reset(self, task, seed: int = 0):
        return self._call("reset", task, seed)

    def step(self, message):
        return self._call("step", message)

    def verify(self):
        return self._call("verify")

    def close(self) -> None:
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            self.link.call("close", env_id)


def remote_family(family, link: PoolLink, domain: str | None = None):
    """`family` with its scoring and its environments moved to the pool behind `link`."""
    def score_many(tasks, replies, **kwargs):
        return link.call("score", domain, list(tasks), list(replies), kwargs)

    if family.kind == "answer":
        return replace(family, score_many=score_many)
    return replace(family, make_env=lambda task: RemoteEnv(link, domain, task))


def start_pools(ray, cfg) -> list:
    """The run's sandbox-pool actors (restarted by Ray when they die)."""
    rt = cfg.runtime
    opts = {"num_cpus": rt.sandbox_cpus, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 64}
    if rt.sandbox_memory_gb:
        opts["memory"] = int(rt.sandbox_memory_gb * 2**30)
    cls = ray.remote(**opts)(SandboxPool)
    cfg_json = cfg.model_dump_json()
    return [cls.options(**placed("sandbox", k)).remote(cfg_json, own_priority()) for k in range(rt.sandbox_pools)]
