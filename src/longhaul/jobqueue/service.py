"""The queue service: a detached Ray actor (`longhaul-queue`) that keeps the submitted runs of
many domains (`store.py`), lets the placer decide which start where, and starts, watches and
pre-empts them on the cluster.

A pass (every `pass_every_s`):
1. the alive nodes are read from Ray (`nodes_from_ray`); a node gone takes its runs back to
   the queue (their processes died with it), and the placer's cluster is rebuilt over the
   nodes there are, with the runs still running on theirs; what Ray counts as in use on each
   node beyond the queue's runs (`usage_from_ray`: the cluster's other users) is booked as held;
2. each running run's process is polled: exit 0 is done, 143 (it saved on a notice) goes back
   to the queue, anything else failed (its last error line kept), a dead actor is requeued;
3. runs asked to cancel are taken out (a running one stopped, as a pre-emption stops it);
4. new submissions join the placer's queues, and the placer's pass runs: a pre-empted run is
   stopped (SIGTERM: it saves and exits 143; SIGKILL after `stop_grace_s`) and requeued
   before the run that evicted it starts, so no node holds both; a run that starts gets a
   placement group pinned to the placer's node and its process inside it (`runner.py`).

Every pass checks the placer's ledger (`Cluster.check`): no node is ever promised beyond what
Ray reports it has. A run's units (`units.py`: its driver, with `--cpus`, `--mem-gb`, `--gpus`,
and the trainer, rollout and sandbox actors of a Ray-backed run) are placed as one gang, each
in its bundle on its node; its checkpoint is cached on the node its driver last ran on, which
the placer prefers when it comes back. A run that loses any of its nodes is requeued.
The placer's fair-share memory starts afresh when the service restarts or the nodes change;
the runs do not.

`/metrics` (with `metrics_port`): the runs in each state by domain, each run's state, passes,
starts, pre-emptions, lost nodes, and each node's free CPUs and GPUs, in Prometheus' text format.
"""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.jobqueue.runner import ACTOR_PREFIX, NAMESPACE, STOPPED, RunProcess, last_error, run_argv
from longhaul.jobqueue.store import FINAL, LIVE, RunRecord, RunStore
from longhaul.jobqueue.units import placement_env
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, WorkUnit
from longhaul.placement.placer import OUTSIDE, Placer, PlacerConfig
from longhaul.placement.ray_mapping import actor_options, group_name, nodes_from_ray, release, reserve, usage_from_ray


def units_of(rec: RunRecord) -> list[dict]:
    return rec.units or [{"kind": "driver", "cpus": rec.cpus, "mem_gb": rec.mem_gb, "gpus": rec.gpus}]


def job_of(rec: RunRecord) -> Job:
    units = tuple(WorkUnit(u["kind"], Resources(u["cpus"], u["mem_gb"], u["gpus"])) for u in units_of(rec))
    return Job(rec.id, rec.domain, units, priority=rec.priority, checkpoint=rec.id, submitted=rec.submitted)


def unplaceable(rec: RunRecord, nodes: list[Node]) -> str | None:
    """Why no node of the cluster could ever hold one of the run's units, or None."""
    if not nodes:
        return "the Ray cluster has no alive node"
    for u in units_of(rec):
        if any(u["cpus"] <= n.capacity.cpus and u["mem_gb"] <= n.capacity.mem_gb and u["gpus"] <= n.capacity.gpus for n in nodes):
            continue
        most = max(nodes, key=lambda n: (n.capacity.gpus, n.capacity.cpus, n.capacity.mem_gb)).capacity
        what = "lower --cpus/--mem-gb/--gpus" if u["kind"] == "driver" else f"lower its runtime settings for the {u['kind']} actors"
        return (f"no node of the cluster has {u['cpus']:g} CPUs, {u['mem_gb']:g} GB and {u['gpus']} GPUs for the run's {u['kind']} "
                f"(the node with the most GPUs has {most.cpus:g} CPUs, {most.mem_gb:.0f} GB, {most.gpus} GPUs); {what} or add such a node")
    return None


class QueueService:
    """The actor body (`start_service` wraps it with `ray.remote`)."""

    def __init__(self, db: str, home: str, placer: dict | None = None, pass_every_s: float = 1.0, stop_grace_s: float = 120.0,
                 metrics_port: int = 0):
        self.store = RunStore(db)
        self.home = Path(home)
        self.cfg = PlacerConfig(**(placer or {}))
        self.pass_every_s, self.stop_grace_s = pass_every_s, stop_grace_s
        self.lock = threading.RLock()
        self.actors: dict[str, object] = {}  # run id -> its RunProcess actor
        self.groups: dict[str, object] = {}  # run id -> its placement group
        self.counts = {"passes": 0, "starts": 0, "preemptions": 0, "nodes_lost": 0, "adopted": 0, "requeued_on_restart": 0}
        self.error = ""  # the last pass's error, if it raised
        self.nodes: list[Node] = []
        self.placer: Placer | None = None
        self._stop = threading.Event()
        with self.lock:
            self._adopt()
        self._thread = threading.Thread(target=self._loop, name="longhaul-queue-passes", daemon=True)
        self._thread.start()
        self.metrics_port = _serve_metrics(self, metrics_port) if metrics_port >= 0 else None

    # ---- what clients call ---------------------------------------------------------------
    def submit(self, rec: dict) -> dict:
        """Store a run (refused when no node could ever hold it)."""
        run = RunRecord(**{**rec, "id": "", "state": "queued"})
        why = unplaceable(run, nodes_from_ray())
        if why:
            raise LonghaulError(why)
        return self.store.add(run).view()

    def cancel(self, run_id: str) -> dict:
        rec = self.store.get(run_id)
        if rec is None:
            raise LonghaulError(f"no run {run_id!r} in the queue; `longhaul queue status` lists them")
        if rec.state in FINAL:
            raise LonghaulError(f"run {run_id} already ended ({rec.state}); nothing to cancel")
        return self.store.update(run_id, cancel=True).view()

    def status(self) -> dict:
        held = self.outside()
        other = lambda n: held.get(n.name, Resources(0.0, 0.0, 0))  # noqa: E731
        nodes = [{"node": n.name, "rack": n.rack, "cpus": n.capacity.cpus, "mem_gb": round(n.capacity.mem_gb, 1),
                  "gpus": n.capacity.gpus, "other_cpus": other(n).cpus, "other_gpus": other(n).gpus} for n in self.nodes]
        return {"runs": [r.view() for r in self.store.all()], "nodes": nodes, "counts": dict(self.counts), "error": self.error,
                "metrics_port": self.metrics_port}

    def shutdown(self) -> None:
        """Stop passing (runs keep running; a new service adopts them)."""
        self._stop.set()
        self._thread.join(30)

    # ---- passes --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.pass_every_s):
            try:
                with self.lock:
                    self.tick()
                self.error = ""
            except Exception as e:  # a pass that fails is retried at the next; the error shows in status
                self.error = f"{type(e).__name__}: {e}"

    def tick(self) -> None:
        now = time.time()
        self._follow_nodes(now)
        self._note_other_work()  # before any run of ours ends this pass: Ray and the ledger agree on ours
        self._poll(now)
        self._cancel(now)
        queued = {j.id for q in self.placer.queues.values() for j in q}
        for rec in self.store.all(("queued",)):
            if rec.id not in queued and rec.id not in self.placer.running:
                self.placer.submit(job_of(rec), now)
        for what, run in self.placer.schedule(now):
            if what == "preempt":
                self._preempt(run.job.id)
            elif what == "start":
                self._start(run, now)
        self.placer.c.check()
        self.counts["passes"] += 1

    def _follow_nodes(self, now: float) -> None:
        nodes = sorted(nodes_from_ray(), key=lambda n: n.name)  # Ray lists them in no fixed order
        if self.placer is not None and nodes == self.nodes:
            return
        alive = {n.name for n in nodes}
        for rec in self.store.all(LIVE):
            gone = [n for n in rec.nodes or [rec.node] if n not in alive]
            if gone:
                self.counts["nodes_lost"] += 1
                self._requeue(rec.id, f"its node {gone[0][:12]} left the cluster", kill=True)
        self._rebuild(nodes, now)

    def _rebuild(self, nodes: list[Node], now: float) -> None:
        """The placer over `nodes`, with the live runs on their nodes and the queued ones in order."""
        self.nodes, self.placer = nodes, Placer(Cluster(nodes), self.cfg)
        index = {n.name: i for i, n in enumerate(nodes)}
        for rec in self.store.all(LIVE):
            job = job_of(rec)
            self.placer.submit(job, rec.submitted)
            self.placer.books.start(job, [index[n] for n in rec.nodes or [rec.node]], rec.started or now)
        for rec in self.store.all(("queued",)):
            if rec.node in index:  # its checkpoint is cached where it last ran
                self.placer.c.note_checkpoint(index[rec.node], rec.id)
            self.placer.submit(job_of(rec), rec.submitted)

    def _note_other_work(self) -> None:
        """Book what Ray says is in use on each node beyond the queue's own runs (actors, tasks and
        placement groups of the cluster's other users) as held, so the placer plans around it."""
        c = self.placer.c
        booked = dict(c.holdings.get(OUTSIDE, []))  # node -> what the last pass booked for the others
        used = usage_from_ray()
        other = []
        for i, n in enumerate(c.nodes):
            if n.name not in used:
                continue
            was = booked.get(i, (0, 0, 0))
            ours = [cap - free - w for cap, free, w in zip(c.cap[i], c.free[i], was)]  # what the queue's runs hold
            extra = tuple(max(0, min(u - o, f + w)) for u, o, f, w in zip(used[n.name].units(), ours, c.free[i], was))
            if any(extra):
                other.append((i, Resources.of(extra)))
        self.placer.hold_outside(other)

    def outside(self) -> dict[str, Resources]:
        """Node name -> what the cluster's other users hold there, as the last pass booked it."""
        if self.placer is None:
            return {}
        c = self.placer.c
        return {c.nodes[i].name: Resources.of(u) for i, u in c.holdings.get(OUTSIDE, [])}

    def _poll(self, now: float) -> None:
        import ray

        for rec in self.store.all(("running",)):
            actor = self.actors.get(rec.id)
            try:
                code = ray.get(actor.poll.remote(), timeout=60) if actor is not None else None
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self._requeue(rec.id, f"its process was lost ({type(e).__name__})", kill=True)
                continue
            if actor is None:
                self._requeue(rec.id, "its process was lost", kill=True)
            elif code is not None:
                self._ended(rec, code, now)

    def _ended(self, rec: RunRecord, code: int, now: float) -> None:
        import ray

        tail = ray.get(self.actors[rec.id].tail.remote())
        self._drop(rec.id)
        self.placer.release(rec.id)
        if code == 0:
            self.store.move(rec.id, ("running",), "done", ended=now, exit_code=0, reason="")
        elif code == STOPPED:  # told to stop by someone else (a node drain): it saved; it goes on later
            self.store.move(rec.id, ("running",), "queued", exit_code=code, reason="stopped by a signal; saved, requeued")
        else:
            self.store.move(rec.id, ("running",), "failed", ended=now, exit_code=code, reason=last_error(tail))

    def _cancel(self, now: float) -> None:
        for rec in self.store.all(("queued", "running")):
            if not rec.cancel:
                continue
            if rec.state == "running":
                self._stop_run(rec.id)
            elif rec.id in self.placer.jobs:
                self.placer.withdraw(rec.id)
            self.store.move(rec.id, ("queued", "running"), "cancelled", ended=now, reason="cancelled")

    def _preempt(self, run_id: str) -> None:
        """The placer evicted `run_id` (and requeued it in its books): stop it so it saves."""
        code = self._stop_run(run_id, release_placer=False)
        rec = self.store.get(run_id)
        self.counts["preemptions"] += 1
        self.store.move(run_id, ("running", "starting"), "queued", preemptions=rec.preemptions + 1, exit_code=code,
                        reason="pre-empted; saved and requeued" if code == STOPPED else f"pre-empted; exit {code}, requeued")

    def _stop_run(self, run_id: str, release_placer: bool = True) -> int | None:
        import ray

        actor, code = self.actors.get(run_id), None
        if actor is not None:
            try:
                code = ray.get(actor.stop.remote(self.stop_grace_s), timeout=self.stop_grace_s + 60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                code = None
        self._drop(run_id)
        if release_placer and run_id in self.placer.running:
            self.placer.release(run_id)
        return code

    def _requeue(self, run_id: str, reason: str, kill: bool = False) -> None:
        if kill:
            self._drop(run_id)
        if self.placer is not None and run_id in self.placer.running:
            self.placer.release(run_id)
        self.store.move(run_id, LIVE, "queued", reason=reason)

    def _drop(self, run_id: str) -> None:
        """End a run's actor and placement group (whatever is left of them)."""
        import ray

        actor, pg = self.actors.pop(run_id, None), self.groups.pop(run_id, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:
                pass
        if pg is not None:
            try:
                release(pg)
            except Exception:
                pass

    def _start(self, run, now: float) -> None:
        import ray

        rec = self.store.get(run.job.id)
        nodes = [self.placer.c.nodes[i].name for i in run.nodes]
        rec = self.store.move(rec.id, ("queued",), "starting", node=nodes[0], nodes=nodes, attempts=rec.attempts + 1, started=now)
        if rec is None:  # cancelled between the submit and this pass
            self.placer.release(run.job.id)
            return
        try:
            pg = reserve(run.job, run, self.placer.c, self.cfg, timeout_s=60, lifetime="detached")
            self.groups[rec.id] = pg
            root = self.home / "runs" / rec.id
            root.mkdir(parents=True, exist_ok=True)
            config = root / "config.submitted.yaml"
            config.write_text(rec.config)
            proc = ray.remote(RunProcess).options(name=ACTOR_PREFIX + rec.id, namespace=NAMESPACE, lifetime="detached",
                                                  max_concurrency=4, **actor_options(pg, 0, run.job))
            self.actors[rec.id] = proc.remote(rec.id, run_argv(config, rec.overrides, root), rec.workdir,
                                              str(root / f"attempt-{rec.attempts}.log"),
                                              placement_env(NAMESPACE, group_name(rec.id), units_of(rec)))
            ray.get(self.actors[rec.id].info.remote(), timeout=120)
        except Exception as e:
            self._drop(rec.id)
            self.placer.release(rec.id)
            self.store.move(rec.id, ("starting",), "queued", reason=f"could not start: {e}"[:300])
            return
        self.counts["starts"] += 1
        self.store.move(rec.id, ("starting",), "running")

    def _adopt(self) -> None:
        """After a restart: runs whose process still exists are watched again, the others requeued."""
        import ray
        from ray.util import get_placement_group

        for rec in self.store.all(LIVE):
            try:
                actor = ray.get_actor(ACTOR_PREFIX + rec.id, namespace=NAMESPACE)
                ray.get(actor.info.remote(), timeout=60)
            except Exception:
                actor = None
            if actor is None:
                self.counts["requeued_on_restart"] += 1
                try:
                    release(get_placement_group(group_name(rec.id)))
                except Exception:
                    pass
                self.store.move(rec.id, LIVE, "queued", reason="the service restarted and its process was gone")
                continue
            self.actors[rec.id] = actor
            try:
                self.groups[rec.id] = get_placement_group(group_name(rec.id))
            except Exception:
                pass
            self.counts["adopted"] += 1
            self.store.move(rec.id, LIVE, "running")
        self._follow_nodes(time.time())


def metrics_text(svc: QueueService) -> str:
    lines = ["# TYPE longhaul_queue_runs gauge"]
    runs = svc.store.all()
    counts: dict[tuple, int] = {}
    for r in runs:
        counts[(r.domain, r.state)] = counts.get((r.domain, r.state), 0) + 1
    lines += [f'longhaul_queue_runs{{domain="{d}",state="{s}"}} {n}' for (d, s), n in sorted(counts.items())]
    lines.append("# TYPE longhaul_queue_run_info gauge")
    lines += [f'longhaul_queue_run_info{{run="{r.id}",domain="{r.domain}",priority="{r.priority}",state="{r.state}",'
              f'node="{r.node[:12]}"}} 1' for r in runs]
    for k, v in svc.counts.items():
        lines += [f"# TYPE longhaul_queue_{k}_total counter", f"longhaul_queue_{k}_total {v}"]
    if svc.placer is not None:
        c = svc.placer.c
        lines.append("# TYPE longhaul_queue_node_free_cpus gauge")
        lines += [f'longhaul_queue_node_free_cpus{{node="{n.name[:12]}",rack="{n.rack}"}} {c.free[i][0] / 1000:g}'
                  for i, n in enumerate(c.nodes)]
        lines.append("# TYPE longhaul_queue_node_other_cpus gauge")  # held by the cluster's other users
        held = svc.outside()
        lines += [f'longhaul_queue_node_other_cpus{{node="{n.name[:12]}",rack="{n.rack}"}} {held[n.name].cpus:g}'
                  for n in c.nodes if n.name in held]
        lines.append("# TYPE longhaul_queue_node_free_gpus gauge")
        lines += [f'longhaul_queue_node_free_gpus{{node="{n.name[:12]}",rack="{n.rack}"}} {c.free[i][2]}' for i, n in enumerate(c.nodes)]
    return "\n".join(lines) + "\n"


def _serve_metrics(svc: QueueService, port: int) -> int:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = metrics_text(svc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="longhaul-queue-metrics", daemon=True).start()
    return server.server_address[1]
