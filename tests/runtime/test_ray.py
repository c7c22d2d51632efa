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
from longhaul.runtime.online import run_training  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo.yaml"


@pytest.fixture(scope="module")
def ray_head():
    """One `ray start --head` cluster for this module's runs (a start and stop cost ~10-20 s each)."""
    exe = shutil.which("ray", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the `ray` command is not installed")
    # RAY_memory_monitor_refresh_ms=0: Ray's own OOM killer off, so that other processes' memory on a shared
    # machine does not kill this cluster's workers (at 95% of the node's memory, whoever holds it)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0"}
    subprocess.run([exe, "start", "--head", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, capture_output=True, env=env, timeout=120)
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([exe, "stop", "--force"], capture_output=True, env=env, timeout=120)


@pytest.fixture()
def ray_cluster(ray_head):
    """The running cluster, joined by the test itself (runtime.address=auto). Afterwards this
    driver disconnects, so the actors it owns die, and the next test waits until the cluster has
    every CPU free again: each test starts on an idle cluster, as on a fresh one."""
    assert not ray.is_initialized()
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        ray.init(address="auto", include_dashboard=False, log_to_driver=False)
        try:
            wait_until(lambda: ray.available_resources().get("CPU", 0) >= ray.cluster_resources()["CPU"], interval=0.1,
                       what="the test's actors to leave the cluster")
        finally:
            ray.shutdown()


@pytest.fixture()
def rollout_pools(monkeypatch):
    """The RayRollouts a run creates, as they are created; each one's `results` maps a request's
    uid to the object ref of its result (ready once the actor has answered)."""
    pools = []
    real_init, real_watch = ray_backend.RayRollouts.__init__, ray_backend.RayRollouts._watch

    def spy(self, *a, **kw):
        self.results = {}
        real_init(self, *a, **kw)
        pools.append(self)

    def watch(self, wid, fut, kind, uid=None):
        if kind == "result":
            self.results[uid] = fut
        real_watch(self, wid, fut, kind, uid)

    monkeypatch.setattr(ray_backend.RayRollouts, "__init__", spy)
    monkeypatch.setattr(ray_backend.RayRollouts, "_watch", watch)
    return pools


def _niceness(pid: int) -> set[int]:
    """The niceness of each thread of process `pid`."""
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


# Ray starts workers at niceness 15; the actors raise themselves to their driver's (root may)
CAN_RAISE_PRIORITY = os.geteuid() == 0


def _watch(act, interval: float = 0.01) -> threading.Event:
    """In a thread: call `act()` every `interval` s until it returns true or the returned event is set
    (the test sets it once its run has ended). No deadline: on a slow machine the run is only longer."""
    over = threading.Event()

    def loop():
        while not over.is_set() and not act():
            over.wait(interval)

    threading.Thread(target=loop, daemon=True).start()
    return over


def _kill_when(find_pid, killed: dict) -> threading.Event:
    """In a thread: SIGKILL the process `find_pid()` names as soon as it names one (until the event is set)."""
    def act() -> bool:
        try:
            pid = find_pid()
        except Exception:  # the run changed what this read meanwhile (a request ended, an actor died): look again
            pid = None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid
        return pid is not None

    return _watch(act)


def _six_async_steps_on_ray(tmp_path, *extra) -> tuple:
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                "train.steps=6", "runtime.mode=async", "runtime.backend=ray", "runtime.address=auto",
                                "runtime.max_staleness=1", "runtime.worker_threads=1", *extra])
    run_training(cfg)
    run = tmp_path / "tiny_grpo"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    submitted = {r["uid"] for r in log if r["op"] == "submit"}
    put = {r["uid"] for r in log if r["op"] == "put"}
    taken = [u for r in log if r["op"] == "take" for u in r["uids"]]
    assert {u.split("/")[0] for u in put} == submitted, "every request's groups arrived"
    assert len(taken) == len(set(taken)) == 6 * cfg.rollout.prompts_per_step
    assert all(not r.get("group") or all(t["info"].get("ended") != "infra_error" for t in r["group"]) for r in log if r["op"] == "put")
    return cfg, rows


def test_tiny_grpo_on_a_ray_cluster_survives_a_killed_rollout_actor(tmp_path, ray_cluster, rollout_pools):
    def busy_actor():  # a request is in flight on an actor: its process
        pools = rollout_pools
        if pools and pools[0]._running:
            pool, pids = pools[0], pools[0].actor_pids()
            for uid, (wid, _, _) in list(pool._running.items()):
                # not one the actor has answered already, whose answer waits for the busy driver to read it
                if wid in pids and uid in pool.results and not ray.wait([pool.results[uid]], timeout=0)[0]:
                    return pids[wid]
        return None

    killed = {}
    over = _kill_when(busy_actor, killed)
    try:
        _, rows = _six_async_steps_on_ray(tmp_path)
    finally:
        over.set()
    assert killed, "the test never caught a request in flight"
    assert rows[-1]["rollout/worker_restarts"] >= 1 and rows[-1]["rollout/requeued_requests"] >= 1


@pytest.mark.slow  # ~10 s: a Ray cluster run; the killed rollout actor test stays fast
def test_scoring_in_a_sandbox_pool_actor_survives_the_pool_being_killed(tmp_path, ray_cluster, rollout_pools):
    seen = {}

    def scoring_pool():  # once the pool has scored, while requests are in flight: its process
        pools = rollout_pools
        if pools and pools[0]._running and ray.get(pools[0].sandbox_pools[0].stats.remote())["scored"] > 0:
            pid = ray.get(pools[0].sandbox_pools[0].pid.remote())
            seen["niceness"] = set().union(_niceness(pid), *(_niceness(p) for p in pools[0].actor_pids().values()))
            return pid
        return None

    killed = {}
    over = _kill_when(scoring_pool, killed)
    try:
        _, rows = _six_async_steps_on_ray(tmp_path, "runtime.sandbox_pools=1", "runtime.sandbox_cpus=0.5")
    finally:
        over.set()
    assert killed, "the test never caught the pool with requests in flight"
    assert rows[-1]["sandbox/pools_answering"] == 1 and rows[-1]["sandbox/scored"] > 0, "the restarted pool scores"
    assert rows[-1]["rollout/worker_restarts"] == 0, "a dead sandbox pool does not cost the rollout actor"
    if CAN_RAISE_PRIORITY:
        assert seen["niceness"] == {os.getpriority(os.PRIO_PROCESS, 0)}, "pool and rollout actors run at the driver's priority"


def test_sandbox_pools_need_async_on_ray(tmp_path):
    from longhaul.errors import LonghaulError

    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "runtime.sandbox_pools=1"])
    with pytest.raises(LonghaulError, match="sandbox_pools=1 needs runtime.backend=ray and runtime.mode=async"):
        run_training(cfg)


@pytest.mark.slow  # ~18 s; the killed rollout actor test stays fast
def test_a_killed_trainer_actor_is_replaced_and_the_run_resumes_from_its_checkpoint(tmp_path, ray_cluster):
    from longhaul.rl.checkpoint import list_checkpoints

    run = tmp_path / "tiny_grpo"
    actors, killed = [], {}

    def killer() -> bool:
        if actors and list_checkpoints(run / "checkpoints"):  # step 2 is saved: kill the trainer mid-run
            pid = ray.get(actors[0].pid.remote())
            killed["niceness"] = _niceness(pid)
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid
            return True
        return False

    over = _watch(killer, 0.02)
    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                "train.steps=6", "train.save_every=2", "runtime.mode=async", "runtime.backend=ray",
                                "runtime.address=auto", "runtime.trainer_actor=true", "runtime.worker_threads=1"])
    try:
        result = ray_backend.train_in_actor(cfg, on_start=actors.append)
    finally:
        over.set()
    assert killed, "the trainer was never killed"
    if CAN_RAISE_PRIORITY:  # not Ray's 15: beside any busy process that would starve the run
        assert killed["niceness"] == {os.getpriority(os.PRIO_PROCESS, 0)}
    assert result["trainer_restarts"] == 1 and len(actors) == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7)), "every step logged once: the rows after the checkpoint were replaced"
    assert list_checkpoints(run / "checkpoints")[-1].name.endswith("6")
    log = [json.loads(line) for line in (run / "buffer.jsonl").read_text().splitlines()]
    taken = [u for r in log if r["op"] == "take" for u in r["uids"]]
    assert len(taken) == len(set(taken)) == 6 * cfg.rollout.prompts_per_step


def test_trainer_actor_needs_the_ray_backend(tmp_path):
    from longhaul.errors import LonghaulError
    from longhaul.runtime import train

    cfg = load_config(EXAMPLE, [f"output_dir={tmp_path}", "runtime.trainer_actor=true"])
    with pytest.raises(LonghaulError, match="needs runtime.backend=ray"):
        train(cfg)


def _long_run_in_a_trainer_actor(tmp_path, *extra):
    """200 tiny sync steps in a trainer actor: long enough that only a stop ends them in a test."""
    return load_config(EXAMPLE, [f"output_dir={tmp_path}", "log.progress=false", "log.tensorboard=false", "eval.before_after=false",
                                 "train.steps=200", "runtime.backend=ray", "runtime.address=auto", "runtime.trainer_actor=true", *extra])


def test_a_stop_notice_to_the_driver_reaches_the_trainer_actor(tmp_path, ray_cluster):
    """SIGTERM to the process waiting on a trainer actor: the actor's run saves after its step and
    the driver raises the same StopRequested (exit status 143) a local run would."""
    from longhaul.runtime.notice import StopRequested

    run = tmp_path / "tiny_grpo"

    def signal_after_first_step() -> bool:
        if (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip():
            os.kill(os.getpid(), signal.SIGTERM)
            return True
        return False

    over = _watch(signal_after_first_step, 0.05)
    cfg = _long_run_in_a_trainer_actor(tmp_path, "train.save_every=0")
    try:
        with pytest.raises(StopRequested, match=r"^SIGTERM received: stopped after step \d+ of 200") as stop:
            ray_backend.train_in_actor(cfg)
    finally:
        over.set()
    assert stop.value.exit_code == 143
    step = int(str(stop.value).split("after step ")[1].split()[0])
    assert [p.name for p in (run / "checkpoints").iterdir()] == [f"step_{step}"]
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step


def test_a_trainer_actor_that_dies_while_stopping_is_not_replaced(tmp_path, ray_cluster):
    """Told to stop, then the actor dies (its node is going away): the run ends with the stop,
    from the last checkpoint, instead of starting a new actor."""
    from longhaul.runtime.notice import StopRequested

    run, actors, done = tmp_path / "tiny_grpo", [], {}

    def stop_then_kill() -> bool:
        if actors and (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip():
            pid = ray.get(actors[0].pid.remote())
            done["stop"] = True  # before the signal: the run may end before this thread runs again
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # not a wait for anything: the kill comes just after the stop, or once the run has saved
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it had already saved and stopped
                pass
            return True
        return False

    over = _watch(stop_then_kill, 0.05)
    cfg = _long_run_in_a_trainer_actor(tmp_path, "train.save_every=1")
    try:
        with pytest.raises(StopRequested, match=r"^SIGTERM received: "):
            ray_backend.train_in_actor(cfg, on_start=actors.append)
    finally:
        over.set()
    assert done, "the stop was never sent"
    assert len(actors) == 1, "a stopped run must not start another trainer actor"
