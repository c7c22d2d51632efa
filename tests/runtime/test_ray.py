"""The Ray backend end to end: `ray start --head`, then examples/tiny_grpo.yaml with
runtime.backend=ray runtime.address=auto; a rollout actor is killed mid-run and the run
still completes without losing a trajectory."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from longhaul.config import load_config  # noqa: E402
from longhaul.runtime import ray_backend  # noqa: E402
from longhaul.runtime.sync import run_training  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"


@pytest.fixture()
def ray_cluster(tmp_path):
    exe = shutil.which("ray", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the `ray` command is not installed")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([exe, "start", "--head", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, capture_output=True, env=env, timeout=120)
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([exe, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_tiny_grpo_on_a_ray_cluster_survives_a_killed_rollout_actor(tmp_path, ray_cluster, monkeypatch):
    pools = []
    real_init = ray_backend.RayRollouts.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        pools.append(self)

    monkeypatch.setattr(ray_backend.RayRollouts, "__init__", spy)
    killed = {}

    def killer():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if pools and pools[0]._running:  # a request is in flight on the actor: kill its process
                pids = pools[0].actor_pids()
                wid = next(iter(pools[0]._running.values()))[0]
                if wid in pids:
                    os.kill(pids[wid], signal.SIGKILL)
                    killed["pid"] = pids[wid]
                    return
            time.sleep(0.05)

    threading.Thread(target=killer, daemon=True).start()
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                "train.steps=6", "runtime.mode=async", "runtime.backend=ray", "runtime.address=auto",
                                "runtime.max_staleness=1", "runtime.worker_threads=1"])
    run_training(cfg)
    run = tmp_path / "tiny_grpo"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert killed, "the test never caught a request in flight"
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[-1]["rollout/worker_restarts"] >= 1 and rows[-1]["rollout/requeued_requests"] >= 1
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    submitted = {r["uid"] for r in log if r["op"] == "submit"}
    put = {r["uid"] for r in log if r["op"] == "put"}
    taken = [u for r in log if r["op"] == "take" for u in r["uids"]]
    assert {u.split("/")[0] for u in put} == submitted, "every request's groups arrived"
    assert len(taken) == len(set(taken)) == 6 * cfg.rollout.prompts_per_step
    assert all(not r.get("group") or all(t["info"].get("ended") != "infra_error" for t in r["group"]) for r in log if r["op"] == "put")


def test_a_killed_trainer_actor_is_replaced_and_the_run_resumes_from_its_checkpoint(tmp_path, ray_cluster):
    from longhaul.rl.checkpoint import list_checkpoints

    run = tmp_path / "tiny_grpo"
    actors, killed = [], {}

    def killer():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if actors and list_checkpoints(run / "checkpoints"):  # step 2 is saved: kill the trainer mid-run
                pid = ray.get(actors[0].pid.remote())
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
                return
            time.sleep(0.02)

    threading.Thread(target=killer, daemon=True).start()
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                "train.steps=10", "train.save_every=2", "runtime.mode=async", "runtime.backend=ray",
                                "runtime.address=auto", "runtime.trainer_actor=true", "runtime.worker_threads=1"])
    result = ray_backend.train_in_actor(cfg, on_start=actors.append)
    assert killed, "the trainer was never killed"
    assert result["trainer_restarts"] == 1 and len(actors) == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11)), "every step logged once: the rows after the checkpoint were replaced"
    assert list_checkpoints(run / "checkpoints")[-1].name.endswith("10")
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    taken = [u for r in log if r["op"] == "take" for u in r["uids"]]
    assert len(taken) == len(set(taken)) == 10 * cfg.rollout.prompts_per_step


def test_trainer_actor_needs_the_ray_backend(tmp_path):
    from longhaul.errors import LonghaulError
    from longhaul.runtime import train

    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "runtime.trainer_actor=true"])
    with pytest.raises(LonghaulError, match="needs runtime.backend=ray"):
        train(cfg)
