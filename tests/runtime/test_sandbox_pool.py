"""Sandbox pools as Ray actors: scores and agent episodes through a pool equal those in process,
and a pool that dies under a call is seen (the call fails, the link counts it) and restarted."""

import os
import signal
import subprocess
import threading

import pytest

ray = pytest.importorskip("ray")

from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes  # noqa: E402
from longhaul.config import RunConfig  # noqa: E402
from longhaul.envs import bugfix, get_family  # noqa: E402
from longhaul.envs.tools import format_call  # noqa: E402
from longhaul.envs.workspace import WorkspaceEnv  # noqa: E402
from longhaul.models.byte_tokenizer import byte_tokenizer  # noqa: E402
from longhaul.runtime.sandbox_pool import PoolLink, remote_family, start_pools  # noqa: E402
from tests.waiting import wait_until  # noqa: E402


def _cfg(family: str) -> RunConfig:
    return RunConfig.model_validate({"name": "pool", "model": {"name": "tiny-llama"}, "task": {"family": family},
                                     "runtime": {"sandbox_pools": 1, "backend": "ray", "mode": "async"}})


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"memory_monitor_refresh_ms": 0},
             runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}})  # no OOM kills for other processes' memory
    try:
        yield
    finally:
        ray.shutdown()


def test_scores_through_a_pool_equal_scores_in_process(local_ray):
    fam = get_family("funcgen")
    (pool,) = start_pools(ray, _cfg("funcgen"))
    remote = remote_family(fam, PoolLink(pool))
    tasks = fam.make_split("train", 4, 1, None)
    replies = [fam.reference_reply(t) for t in tasks] + [fam.null_reply(t) for t in tasks]
    here = fam.score_many(tasks + tasks, replies, timeout_s=5.0, workers=2)
    there = remote.score_many(tasks + tasks, replies, timeout_s=5.0, workers=2)
    assert [s.passed for s in here] == [True] * 4 + [False] * 4
    assert [(s.reward, s.passed, s.status) for s in there] == [(s.reward, s.passed, s.status) for s in here]
    assert ray.get(pool.stats.remote())["scored"] == 8
    ray.kill(pool)


@pytest.mark.slow  # ~16-19 s; the Ray-cluster test in test_ray.py kills a pool mid-run in the fast suite
def test_agent_episodes_through_a_pool_equal_episodes_in_process(local_ray):
    fam = get_family("bugfix")
    (pool,) = start_pools(ray, _cfg("bugfix"))
    remote = remote_family(fam, PoolLink(pool))
    tasks = [bugfix.make_split("train", 1, 1, [p])[0] for p in bugfix.projects()[:2]]
    tok = byte_tokenizer()
    keys = [str(i) for i in range(len(tasks))]

    def run(make_env, oracle):
        scripts = {k: ([a.text() for a in t.reference] if oracle else []) + [format_call("submit")] for k, t in zip(keys, tasks)}
        return run_episodes(ScriptedPolicy(tok, scripts), tok, make_env, tasks, AgentConfig(max_turns=12, max_tokens=10_000_000),
                            keys=keys)

    for oracle in (True, False):
        here, there = run(lambda t: WorkspaceEnv(), oracle), run(remote.make_env, oracle)
        assert [t.info["status"] for t in there] == [t.info["status"] for t in here] == ["pass" if oracle else "fail"] * 2
        assert [(t.reward, t.info["tool_calls"], len(t.turns)) for t in there] == [(t.reward, t.info["tool_calls"], len(t.turns))
                                                                                    for t in here]
    stats = ray.get(pool.stats.remote())
    assert stats["episodes"] == 4 and stats["open_envs"] == 0, "every episode's environment was opened there and closed"
    ray.kill(pool)


@pytest.mark.slow  # ~16-19 s; the Ray-cluster test in test_ray.py kills a pool mid-run in the fast suite
def test_a_pool_that_dies_under_a_call_fails_it_is_counted_and_comes_back(local_ray):
    fam = get_family("funcgen")
    (pool,) = start_pools(ray, _cfg("funcgen"))
    link = PoolLink(pool)
    remote = remote_family(fam, link)
    (task,) = fam.make_split("train", 1, 1, None)
    pid = ray.get(pool.pid.remote())
    slow = "```python\nimport subprocess\nsubprocess.run(['sleep', '61.234'])\n```"  # runs in the verifier's sandbox until the pool is killed

    def kill_the_pool_while_it_runs_the_reply():
        wait_until(lambda: subprocess.run(["pgrep", "-f", "sleep 61.234"], capture_output=True).stdout, what="the reply to run")
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_the_pool_while_it_runs_the_reply, daemon=True).start()
    with pytest.raises(ray.exceptions.RayActorError):  # the pool's death; the verifier's timeout would return a score
        remote.score_many([task], [slow], timeout_s=30.0, workers=1)
    assert link.lost == 1 and link.lost_since(0) and not link.lost_since(1)
    # Ray restarts the pool: the next call is served by a new process
    assert [s.passed for s in remote.score_many([task], [fam.reference_reply(task)], timeout_s=5.0, workers=1)] == [True]
    assert ray.get(pool.pid.remote()) != pid and link.lost == 1
    ray.kill(pool)
