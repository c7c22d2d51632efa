"""The job queue on a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`:
one raylet per node, custom resources standing for racks, one node declaring a GPU): tiny
`longhaul train` runs submitted in two domains start where the placer says (checked against
Ray's own view of each run's actor), no node is ever given more than it has, a high-priority
run pre-empts a low one that saves, is requeued and resumes to the weights of an uninterrupted
run, a restart of the service adopts the runs it finds and starts none twice, and a run whose
node dies is requeued and ends elsewhere."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.cli_main import run_main

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]
GB = 1024 ** 3
SFT = ["examples/tiny_sft.yaml", f"data.path={ROOT / 'examples/data/tiny_chat.jsonl'}", "log.report_to=[]", "eval.before_after=false"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    # Under token authentication a driver started inside a worker of a `cluster_utils` cluster (a queued
    # run's `longhaul train` that starts Ray actors) has its actors cancelled ("Missing authorization
    # header" on the callbacks to it); under `ray start --head` it works. The test cluster runs without tokens.
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = {"a": c.add_node(num_cpus=1, memory=3 * GB, resources={"rack:r1": 1}),
                 "b": c.add_node(num_cpus=1, memory=3 * GB, resources={"rack:r1": 1}),
                 "g": c.add_node(num_cpus=1, num_gpus=1, memory=3 * GB, labels={"rack": "r2"})}  # a label names a rack too
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="longhaul", log_to_driver=False)
        yield c, nodes, tmp_path_factory.mktemp("queue")
    finally:
        ray.shutdown()
        c.shutdown()
        if auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth
        Path("/tmp/ray/ray_current_cluster").unlink(missing_ok=True)  # else a later ray.init() would join the dead cluster


def cli(*args, cwd=ROOT):
    r = run_main(*args, cwd=cwd)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def status() -> dict:
    """The service's status, asked directly (the watcher's thread cannot share the CLI's captured stdout)."""
    return ray.get(ray.get_actor("longhaul-queue", namespace="longhaul").status.remote(), timeout=120)


class Watch:
    """Polls the queue while a test runs: the node of every live run against the node its actor
    is on in Ray's view, and what the live runs ask of each node against what it has."""

    def __init__(self, capacity: dict[str, tuple[float, int]]):
        self.capacity, self.placed, self.over, self.missing, self.stop = capacity, {}, [], [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.3):
            try:
                runs = status()["runs"]
            except (ValueError, ray.exceptions.RayError):  # the service is down (killed, restarting)
                continue
            held: dict[str, list] = {}
            for r in runs:
                if r["state"] not in ("starting", "running"):
                    continue
                for u, node in zip(r["units"] or [r], r["nodes"] or [r["node"]]):  # each unit on its node
                    h = held.setdefault(node, [0.0, 0])
                    h[0], h[1] = h[0] + u["cpus"], h[1] + u["gpus"]
                if r["state"] == "running":
                    try:
                        actor = ray.get_actor(f"longhaul-run-{r['id']}", namespace="longhaul")
                        self.placed[(r["id"], r["attempts"])] = (r["node"], ray.get(actor.info.remote(), timeout=30)["node"])
                    except (ValueError, ray.exceptions.RayError):
                        self._still_running(r)  # it may have ended between the status and the lookup
            self.over += [(n, h) for n, h in held.items() if h[0] > self.capacity[n][0] or h[1] > self.capacity[n][1]]

    def _still_running(self, r: dict, grace_s: float = 15.0) -> None:
        """A run the books call running whose actor could not be reached: fine if it ended, or the
        service saw its actor die and requeued it (at its next pass, hence the grace); a run still
        running as that attempt without its actor after the grace is a fault, kept in `missing`."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                now = by_id(status())[r["id"]]
            except (ValueError, ray.exceptions.RayError):  # the service went down meanwhile: nothing to judge
                return
            if now["state"] != "running" or now["attempts"] != r["attempts"]:
                return
            time.sleep(0.5)
        self.missing.append((r["id"], r["attempts"]))

    def close(self):
        self.stop.set()
        self.thread.join(30)


def wait_for(pred, timeout=300, what="the queue"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status()
        if pred(st):
            return st
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen in {timeout} s: {st}")


def by_id(st) -> dict:
    return {r["id"]: r for r in st["runs"]}


def capacity(c_nodes) -> dict:
    out = {}
    for n in ray.nodes():
        if n["Alive"]:
            out[n["NodeID"]] = (n["Resources"].get("CPU", 0.0), int(n["Resources"].get("GPU", 0)))
    return out


def test_runs_start_where_the_placer_says_and_no_node_is_oversubscribed(cluster):
    c, nodes, home = cluster
    cli("queue", "start", "--home", str(home / "q1"), "--pass-every-s", "0.5", "--metrics-port", "0")
    watch = Watch(capacity(nodes))
    try:
        ids = [cli("submit", *SFT, "train.steps=40", "--domain", d, "--priority", p, *extra).split()[1]
               for d, p, extra in (("x", "0", []), ("y", "0", []), ("x", "1", ["--gpus", "1"]))]
        r = run_main("submit", *SFT, "--gpus", "4", cwd=ROOT)
        assert r.returncode == 2 and "no node of the cluster has 1 CPUs, 0 GB and 4 GPUs for the run's driver" in r.stderr
        r = run_main("submit", "examples/tiny_grpo.yaml", "runtime.mode=async", "runtime.backend=ray", "runtime.worker_cpus=4",
                     cwd=ROOT)  # the run's own rollout actor could fit nowhere
        assert r.returncode == 2 and "has 4 CPUs, 0 GB and 0 GPUs for the run's rollout" in r.stderr, r.stderr
        port = wait_for(lambda s: any(x["state"] == "running" for x in s["runs"]), 120, "a start")["metrics_port"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "longhaul_queue_run_info{" in metrics and "longhaul_queue_node_free_cpus{" in metrics
        st = wait_for(lambda s: all(by_id(s)[i]["state"] in ("done", "failed") for i in ids), 300, "three runs ending")
    finally:
        watch.close()
    table = cli("queue", "status")
    assert all(f"{i}   " in table for i in ids) and "3 starts" in table
    assert json.loads(cli("queue", "status", "--json"))["runs"][0]["id"] == ids[0]
    cli("queue", "stop")
    r = run_main("queue", "status", cwd=ROOT)
    assert r.returncode == 2 and "no queue service on this Ray cluster; start it with `longhaul queue start`" in r.stderr
    runs = by_id(st)
    assert [runs[i]["state"] for i in ids] == ["done"] * 3, [runs[i]["reason"] for i in ids]
    assert runs[ids[2]]["node"] == nodes["g"].node_id  # the GPU run on the GPU node
    assert {n["node"]: n["rack"] for n in st["nodes"]}[nodes["g"].node_id] == "r2"
    assert {runs[ids[0]]["node"], runs[ids[1]]["node"]} == {nodes["a"].node_id, nodes["b"].node_id}  # CPU runs keep off it
    assert watch.placed and all(ours == rays for ours, rays in watch.placed.values())  # Ray put each actor where we said
    assert not watch.over and not watch.missing
    assert all((home / "q1" / "runs" / i / "tiny_sft" / "checkpoints" / "step_40" / "model.safetensors").is_file() for i in ids)


def final_weights(run_root: Path, steps: int) -> dict:
    return load_file(str(run_root / "tiny_sft" / "checkpoints" / f"step_{steps}" / "model.safetensors"))


@pytest.mark.slow
def test_preemption_resumes_exactly_restart_adopts_and_a_lost_node_requeues(cluster, tmp_path):
    c, nodes, home = cluster
    q = home / "q2"
    steps = 300
    ref = tmp_path / "ref"  # the same run, uninterrupted
    subprocess.run([sys.executable, "-m", "longhaul.cli", "train", *SFT, f"train.steps={steps}", f"output_dir={ref}"], cwd=ROOT,
                   check=True, capture_output=True, env=os.environ)
    cli("queue", "start", "--home", str(q), "--pass-every-s", "0.5", "--placer", "preempt_after_s=0", "--stop-grace-s", "60")
    watch = Watch(capacity(nodes))
    try:
        low = [cli("submit", *SFT, f"train.steps={steps}", "train.save_every=1000", "--domain", d).split()[1] for d in ("x", "y")]
        wait_for(lambda s: all(by_id(s)[i]["state"] == "running" for i in low), 120, "two low-priority starts")
        wait_for(lambda s: all((q / "runs" / i / "tiny_sft" / "metrics.jsonl").is_file() for i in low), 120, "training under way")
        high = cli("submit", *SFT, "train.steps=20", "--domain", "y", "--priority", "5").split()[1]
        st = wait_for(lambda s: by_id(s)[high]["state"] == "done", 300, "the high-priority run")
        victim = next(i for i in low if by_id(st)[i]["preemptions"] == 1)
        assert by_id(st)[high]["node"] in {nodes["a"].node_id, nodes["b"].node_id}
        st = wait_for(lambda s: by_id(s)[victim]["attempts"] == 2 and by_id(s)[victim]["state"] == "running", 120, "the resume")
        ray.kill(ray.get_actor("longhaul-queue", namespace="longhaul"))  # the service is killed mid-pass; the runs stay
        time.sleep(2)
        cli("queue", "start", "--home", str(q), "--pass-every-s", "0.5", "--placer", "preempt_after_s=0")
        st = wait_for(lambda s: all(by_id(s)[i]["state"] in ("done", "failed") for i in low), 300, "the low runs ending")
        assert st["counts"]["adopted"] >= 1 and st["counts"]["requeued_on_restart"] == 0
        lost = cli("submit", *SFT, "train.steps=400", "train.save_every=1000", "--domain", "x").split()[1]
        st = wait_for(lambda s: by_id(s)[lost]["state"] == "running", 120, "a run to lose")
        where = next(n for n in nodes.values() if n.node_id == by_id(st)[lost]["node"])
        c.remove_node(where)
        st = wait_for(lambda s: by_id(s)[lost]["attempts"] == 2, 180, "the lost run's restart")
        assert by_id(st)[lost]["node"] != where.node_id
        st = wait_for(lambda s: by_id(s)[lost]["state"] in ("done", "failed"), 300, "the lost run ending elsewhere")
    finally:
        watch.close()
        cli("queue", "stop")
    runs = by_id(st)
    assert [runs[i]["state"] for i in (*low, high, lost)] == ["done"] * 4, [r["reason"] for r in runs.values()]
    other = next(i for i in low if i != victim)
    assert (runs[victim]["attempts"], runs[other]["attempts"]) == (2, 1)  # the restart started nothing again
    log = (q / "runs" / victim / "attempt-1.log").read_text()
    assert "stopped" in log.lower()  # it saved on the notice and said so
    expected = final_weights(ref, steps)
    for i in low:
        got = final_weights(q / "runs" / i, steps)
        assert all(torch_equal(got[k], expected[k]) for k in expected), f"run {i} ended on other weights"
    assert watch.placed and all(ours == rays for ours, rays in watch.placed.values()) and not watch.over and not watch.missing


@pytest.mark.slow
def test_a_ray_backed_runs_rollout_actor_starts_in_its_bundle_on_the_placers_node(cluster):
    """A run whose config runs rollouts on Ray is two units (its driver, one rollout actor of 1
    CPU): while another user's actor holds one of the two CPU nodes the queue sees it and waits;
    then the placer puts the units on two nodes, and the rollout actor the run itself creates
    starts in its bundle of the run's placement group, on the node the placer chose for it."""
    from ray._private.state import actors  # the GCS's actor table (ray.util.state needs the dashboard, off here)

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    class Busy:  # defined here, so Ray ships it by value (the test module is not importable on its workers)
        def ready(self) -> bool:
            return True

    c, nodes, home = cluster
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    cpu_nodes = [nodes[k].node_id for k in ("a", "b") if nodes[k].node_id in alive]  # another test may have removed one
    while len(cpu_nodes) < 2:
        cpu_nodes.append(c.add_node(num_cpus=1, memory=3 * GB, resources={"rack:r1": 1}).node_id)
    c.wait_for_nodes()
    cli("queue", "start", "--home", str(home / "q3"), "--pass-every-s", "0.5")
    watch = Watch(capacity(nodes))
    # another user's actor holds a CPU node: the queue sees it and waits instead of trying there
    other = ray.remote(num_cpus=1)(Busy).options(scheduling_strategy=NodeAffinitySchedulingStrategy(cpu_nodes[0], soft=False)).remote()
    ray.get(other.ready.remote(), timeout=60)
    try:
        rid = cli("submit", "examples/tiny_grpo.yaml", "runtime.mode=async", "runtime.backend=ray", "runtime.workers=1",
                  "runtime.worker_cpus=1", "log.report_to=[]", "eval.before_after=false", "--domain", "x").split()[1]
        st = wait_for(lambda s: s["counts"]["passes"] >= 6, 60, "six passes")
        assert by_id(st)[rid]["state"] == "queued" and by_id(st)[rid]["attempts"] == 0  # no start tried where Ray has no room
        assert {n["node"]: n["other_cpus"] for n in st["nodes"]}[cpu_nodes[0]] == 1.0
        ray.kill(other)
        st = wait_for(lambda s: by_id(s)[rid]["state"] in ("done", "failed"), 300, "the Ray-backed run ending")
    finally:
        watch.close()
        cli("queue", "stop")
    run = by_id(st)[rid]
    assert run["state"] == "done", run["reason"]
    assert [u["kind"] for u in run["units"]] == ["driver", "rollout"]
    assert sorted(run["nodes"]) == sorted(cpu_nodes)  # 1 CPU a node; CPU units keep off the GPU node
    rollouts = [a for a in actors().values() if a["ActorClassName"] == "_RolloutActor"]
    assert rollouts and {a["Address"]["NodeID"] for a in rollouts} == {run["nodes"][1]}
    assert not watch.over and not watch.missing


def torch_equal(a, b) -> bool:
    import torch

    return torch.allclose(a, b, rtol=0, atol=1e-6)
