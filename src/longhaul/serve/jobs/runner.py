"""Running agent jobs: one whole episode (env + sandbox) a job, on the server's engine.

Owns `JobSpec` (what `POST /v1/jobs` takes: a task family, the split and seed that pick the
task, difficulty, turn and token limits, sampling), `EnginePolicy` (the agent loop's
`Policy` over the server's engine loop: each reply is a request that shares the running batch
with HTTP traffic) and `JobRunner` (worker threads that claim jobs from the store, run the
episode with `longhaul.agent.loop.run_episodes` exactly as training does (workspace families
in `WorkspaceEnv`'s bubblewrap sandbox, answer families in `AnswerEnv` with the family's
verifier), and store the trajectory). A job interrupted by shutdown goes back to the queue; a
job whose episode raises is failed with the error. Does not own persistence (`store`).
"""

from __future__ import annotations

import logging
import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from longhaul.agent.loop import AgentConfig, Generation, run_episodes
from longhaul.envs import get_family
from longhaul.envs.base import AnswerEnv
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.inference.engine_loop import ThreadStream
from longhaul.inference.sampling import SamplingParams

log = logging.getLogger("longhaul.serve")


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: str = Field(min_length=1)  # a built-in family (funcgen, echo, bugfix, terminal, multistep ...) or package.module:Name
    split: Literal["train", "heldout"] = "heldout"
    seed: int = Field(0, ge=0, lt=10_000)  # the task: the seed-th task of the split
    difficulty: int = Field(1, ge=1, le=10)
    max_turns: int = Field(8, ge=1, le=64)
    max_new_tokens: int = Field(256, ge=1, le=8192)  # per reply
    max_tokens: int | None = Field(None, ge=16)  # context of the episode; default the model's
    temperature: float = Field(0.0, ge=0, le=2)  # 0: greedy, a reproducible episode
    top_p: float = Field(1.0, gt=0, le=1)
    sample_seed: int = 0


def check_spec(spec: JobSpec):
    """The family of a spec, or a ValueError naming what does not exist."""
    try:
        fam = get_family(spec.family)
    except LonghaulError as e:
        raise ValueError(str(e)) from None
    if spec.split not in fam.splits:
        raise ValueError(f"family {fam.name!r} has no split {spec.split!r}; it has {', '.join(fam.splits)}")
    if spec.difficulty not in fam.difficulties:
        raise ValueError(f"family {fam.name!r} has difficulties {list(fam.difficulties)}, not {spec.difficulty}")
    return fam


class EnginePolicy:
    """`Policy.generate` over the engine loop (blocking; called from a job worker thread)."""

    def __init__(self, loop, seed: int = 0, key=None):
        self.loop, self.seed, self.key, self.calls = loop, seed, key, 0

    def generate(self, prompts, sampling, keys=None):
        streams = []
        for i, p in enumerate(prompts):
            params = SamplingParams(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                                    stop=list(sampling.stop) or None, include_stop_str_in_output=True,
                                    skip_special_tokens=False, seed=(self.seed * 1_000_003 + self.calls * 1009 + i) % 2**63)
            s = ThreadStream(self.key)
            self.loop.submit(f"job-{id(self)}-{self.calls}-{i}", list(p), params, s)
            streams.append(s)
        self.calls += 1
        outs = [s.wait() for s in streams]
        return [Generation(list(o.token_ids), list(o.logprobs), "length" if o.finish_reason == "length" else "stop",
                           o.weight_version[-1] if o.weight_version else 0) for o in outs]


def trajectory_json(traj, tok) -> dict:
    turns = [{"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids, "logprobs": t.logprobs,
              "completion": tok.decode(t.completion_ids, skip_special_tokens=False), "finish_reason": t.finish_reason,
              "reward": t.reward, "segment": t.segment} for t in traj.turns]
    info = {k: v for k, v in traj.info.items() if isinstance(v, (str, int, float, bool, type(None)))}
    transcript = tok.decode(traj.turns[-1].prompt_ids + traj.turns[-1].completion_ids, skip_special_tokens=False) if traj.turns else ""
    return {"reward": traj.reward, "passed": bool(traj.info.get("passed")), "status": traj.info.get("status"),
            "ended": traj.info.get("ended"), "info": info, "turns": turns, "transcript": transcript}


def run_job(spec: dict, loop, tok, max_model_len: int, key=None) -> dict:
    """Run one job's episode to its end; returns the trajectory as JSON."""
    js = JobSpec.model_validate(spec)
    fam = check_spec(js)
    task = fam.make_split(js.split, js.seed + 1, js.difficulty)[js.seed]
    if fam.kind == "answer":
        make_env, stop = (lambda t: AnswerEnv(fam.score_many)), tuple(fam.stop)
    else:
        make_env, stop = fam.make_env or (lambda t: WorkspaceEnv()), AgentConfig.stop
    cfg = AgentConfig(max_turns=1 if fam.kind == "answer" else js.max_turns, max_tokens=min(js.max_tokens or max_model_len, max_model_len),
                      max_new_tokens=js.max_new_tokens, temperature=js.temperature, top_p=js.top_p, stop=stop, workers=1)
    traj = run_episodes(EnginePolicy(loop, js.sample_seed, key), tok, make_env, [task], cfg)[0]
    return trajectory_json(traj, tok)


class JobRunner:
    """`workers` threads claiming and running jobs until `stop()`."""

    def __init__(self, store, loop, tok, max_model_len: int, workers: int, name: str, lease_s: float):
        self.store, self.loop, self.tok, self.max_model_len = store, loop, tok, max_model_len
        self.workers, self.name, self.lease_s = workers, name, lease_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        n = self.store.recover(self.name)
        if n:
            log.info("jobs recovered", extra={"jobs": n, "worker": self.name})
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"longhaul-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Ask the workers to stop; an episode in flight ends when the engine loop stops
        (its requests fail) and its job is released."""
        self._stop.set()

    def join(self, timeout: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout)

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.store.claim(self.name, timeout=0.5)
            except Exception:  # the store went away (shutdown, Redis restart): try again
                if self._stop.wait(1.0):
                    return
                log.exception("claiming a job failed")
                continue
            if job is not None:
                self._run(job)

    def _run(self, job: dict) -> None:
        beat = threading.Event()

        def heartbeat():
            while not beat.wait(self.lease_s / 3):
                try:
                    self.store.heartbeat(job, self.name)
                except Exception:
                    log.warning("job heartbeat failed", extra={"job": job["id"]})

        threading.Thread(target=heartbeat, daemon=True).start()
        log.info("job started", extra={"job": job["id"], "attempt": job["attempts"], "family": job["spec"].get("family")})
        try:
            result = run_job(job["spec"], self.loop, self.tok, self.max_model_len)
        except Exception as e:
            if self._stop.is_set():  # shutting down: another start runs it again
                self.store.release(job)
                log.info("job released at shutdown", extra={"job": job["id"]})
            else:
                self.store.fail(job, f"{type(e).__name__}: {e}")
                log.warning("job failed", extra={"job": job["id"], "error": str(e)})
            return
        finally:
            beat.set()
        self.store.finish(job, result)
        log.info("job finished", extra={"job": job["id"], "reward": result["reward"], "ended": result["ended"]})
