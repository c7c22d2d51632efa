"""Work units, jobs, and the policies that choose nodes for a job's units.

A `Job` is a gang of `WorkUnit`s (a rollout worker, a sandbox pool, a trainer shard, each with
its resource needs) that starts only when every unit has a node: one domain's rollout batch,
evaluation or training run, with the checkpoint size its GPU units must load. An *elastic* job
(`Job.elastic`: a rollout batch, whose inference workers each serve their share of the episodes
on their own) need not start whole: `shards(job)` splits it into one job per worker, each with
its share of the other units, which a placer with `split_elastic` queues, starts and pre-empts
one by one; only a training run's units must start together. A job the placer started is a
`Running`: its nodes, when it started, and what it reports while it runs. A placement
policy is a function `(view: FreeView, job, cfg) -> [node index per unit] | None`, registered
by name, that only *chooses*: `Cluster.allocate` takes the resources (all or nothing) and
`Placer` orders the jobs. Policies:

- `first_fit`: each unit on the first node, in cluster order, with room. The baseline.
- `pack`: bin-packing by rack. Each unit goes to the tightest rack that can hold it (fewest
  free resources of the kind it needs most), and there to the node it fills best, so racks
  fill one at a time and whole racks stay free for large gangs. CPU-only units keep off GPU
  nodes unless `cpus_per_gpu` CPUs stay free beside every free GPU there (no stranded GPUs).
  Nodes that already hold the job's checkpoint come first. When the checkpoint is at least
  `colocate_gb` (large weights), the whole gang is first tried inside one rack (cached racks
  first), and when it needs more than one rack, racks it already uses are filled first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from longhaul.placement.cluster import Cluster, Resources
from longhaul.rl.registry import Registry

PLACEMENT = Registry("placement policy")


@dataclass(frozen=True)
class WorkUnit:
    kind: str  # "rollout", "sandbox", "trainer", ...: a label for reports and Ray bundles
    needs: Resources
    loads_checkpoint: bool = True  # GPU workers load the policy's weights; sandbox pools do not


@dataclass(frozen=True)
class Replica:
    """A training run whose nodes are data-parallel replicas, each holding the whole model and
    optimizer state (sharded over the node's GPUs, replicated across nodes: HSDP, as fault-tolerant
    trainers such as torchft run it). Run as `shards`, its replicas share one run: it progresses
    at the pace of the replicas running, a replica that leaves while another runs loses only
    `leave_s` (its step in flight, and its peers regroup), and one that joins copies the state
    from a running peer. The last replica running holds the only copy: evicted, it saves (in
    `save_s`, one node writing the whole state) or loses what it did since its last save."""
    leave_s: float  # evicting a replica whose peers run costs this long (the run's step in flight and the regrouping)
    save_s: float | None = None  # the last replica's save on notice (one node writes everything); None: as the job's


@dataclass
class Job:
    id: str
    domain: str
    units: tuple[WorkUnit, ...]
    priority: int = 0
    checkpoint_gb: float = 0.0  # weights each checkpoint-loading unit must load before it works
    checkpoint: str = ""  # cache key of those weights (model and version)
    preemptible: bool = True
    submitted: float = 0.0  # first submission time (kept across pre-emptions)
    checkpoint_every_s: float | None = None  # how often it saves its progress; None: a pre-emption loses all of it
    notice_save_s: float | None = None  # told it is pre-empted, it saves everything in this long, then exits (handover.py); None: it cannot
    elastic: bool = False  # its checkpoint-loading units are independent workers (a rollout batch) or replicas (`replica`): it may run as `shards`
    batch: str | None = None  # a shard (`shards`): the id of the job it is part of
    replica: Replica | None = None  # its units are data-parallel replicas of one training run (each holds the whole state): see `Replica`

    @cached_property
    def needs(self) -> list[tuple[int, int, int]]:
        """Each unit's needs in the ledger's integer units."""
        return [u.needs.units() for u in self.units]

    @cached_property
    def total(self) -> tuple[int, int, int]:
        return tuple(sum(u[k] for u in self.needs) for k in range(3))


@dataclass
class Running:
    job: Job
    nodes: list[int]  # node of each unit
    started: float
    load_from: list[str] = field(default_factory=list)  # per unit: "local", "rack", "remote" or "" (loads nothing)
    working_from: float | None = None  # when it began working, after loading its checkpoint, as the job reports it (None: at `started`)
    pace: float = 1.0  # wall seconds a second of work takes (a gang spread over racks runs slower), as the job reports it
    saved_at: float | None = None  # since when its work is unsaved, as the job reports it (a replica: its run's); None: by its cadence from working_from


def shards(job: Job) -> tuple[Job, ...]:
    """An elastic job as one job per checkpoint-loading worker, ids `<id>#<k>`, the other units
    (sandbox pools) dealt to them in turn; the job itself when it is not elastic or has one worker.
    A rollout batch's shard asks what its units ask and lasts as long as the whole job (its worker
    serves its share of the episodes); a replicated training run's (`Job.replica`) are its
    replicas, each saving alone in `Replica.save_s`. Together they ask exactly what the job asks."""
    workers = [u for u in job.units if u.loads_checkpoint]
    if not job.elastic or len(workers) < 2:
        return (job,)
    rest = [u for u in job.units if not u.loads_checkpoint]
    save = job.replica.save_s if job.replica is not None and job.replica.save_s is not None else job.notice_save_s
    return tuple(replace(job, id=f"{job.id}#{k}", units=(w, *rest[k::len(workers)]), elastic=False, batch=job.id, notice_save_s=save)
                 for k, w in enumerate(workers))


class FreeView:
    """What a search may use: each node's free capacity, plus what pre-empting victims would
    free (`bonus`), minus what this search has already taken; `blocked` nodes are off limits
    (drained for another job)."""

    def __init__(self, cluster: Cluster, bonus: dict[int, list[int]] | None = None, blocked=frozenset(), summaries=None):
        self.c, self.bonus, self.blocked = cluster, bonus or {}, blocked
        self.taken: dict[int, list[int]] = {}
        if summaries is not None:  # (rack_max, rack_free) of this bonus, computed before
            self.rack_max, self.rack_free = summaries
        elif self.bonus:  # the cluster's rack summaries understate what is available here
            self.rack_max, self.rack_free = {}, {}
            for r, members in cluster.racks.items():
                av = [self.avail(i) for i in members]
                self.rack_max[r] = tuple(max(a[k] for a in av) for k in range(3))
                self.rack_free[r] = tuple(sum(a[k] for a in av) for k in range(3))
        else:
            self.rack_max, self.rack_free = cluster.rack_max, cluster.rack_free

    def avail(self, i: int) -> list[int]:
        """Free capacity of node `i` for this search (read only)."""
        f, b, t = self.c.free[i], self.bonus.get(i), self.taken.get(i)
        if not b and not t:
            return f
        a = f
        if b:
            a = [a[k] + b[k] for k in range(3)]
        if t:
            a = [a[k] - t[k] for k in range(3)]
        return a

    def fits(self, i: int, u) -> bool:
        if i in self.blocked:
            return False
        a = self.avail(i)
        return a[0] >= u[0] and a[1] >= u[1] and a[2] >= u[2]

    def take(self, i: int, u) -> None:
        t = self.taken.setdefault(i, [0, 0, 0])
        for k in range(3):
            t[k] += u[k]

    def rack_may_fit(self, r: str, u) -> bool:
        m = self.rack_max[r]
        return m[0] >= u[0] and m[1] >= u[1] and m[2] >= u[2]

    def snapshot(self) -> dict:
        return {i: list(t) for i, t in self.taken.items()}

    def restore(self, snap: dict) -> None:
        self.taken = snap


@PLACEMENT.register("first_fit")
def first_fit(view: FreeView, job: Job, cfg) -> list[int] | None:
    out = []
    for u in job.needs:
        node = next((i for r, members in view.c.racks.items() if view.rack_may_fit(r, u) for i in members if view.fits(i, u)), None)
        if node is None:
            return None
        view.take(node, u)
        out.append(node)
    return out


def _dominant(u, cluster: Cluster) -> int:
    """The resource kind (0 cpu, 1 mem, 2 gpu) this unit needs most of, relative to the cluster."""
    return max(range(3), key=lambda k: u[k] / cluster.total[k] if cluster.total[k] else 0.0)


def _best_node(view: FreeView, rack: str, u, unit: WorkUnit, job: Job, cfg) -> int | None:
    """The node of `rack` that `u` fills best: CPU-only units try CPU nodes first, and go to a
    GPU node only if none fits and the node keeps `cpus_per_gpu` CPUs beside each free GPU."""
    c = view.c
    warm = c.cached_on.get(job.checkpoint, ()) if unit.loads_checkpoint and job.checkpoint else ()
    groups = (c.rack_gpu[rack],) if u[2] else (c.rack_cpu[rack], c.rack_gpu[rack])
    reserve = cfg.cpus_per_gpu * 1000
    for members in groups:
        best, best_key = None, None
        for i in members:
            if i in view.blocked:
                continue
            a = view.avail(i)
            if a[0] < u[0] or a[1] < u[1] or a[2] < u[2]:
                continue
            cap = c.cap[i]
            if u[2] == 0 and cap[2] and a[0] - u[0] < a[2] * reserve:
                continue  # would strand this node's free GPUs without CPUs
            left = (a[0] - u[0]) / cap[0] + (a[1] - u[1]) / cap[1] + ((a[2] - u[2]) / cap[2] if cap[2] else 0.0)
            key = (i not in warm, left, i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        if best is not None:
            return best
    return None


def _rack_order(view: FreeView, u, job: Job, prefer: list[str]) -> list[str]:
    """Racks that may fit `u`: those in `prefer` first (in order), then the tightest first."""
    c = view.c
    k = _dominant(u, c)
    cached = {c.rack_of[i] for i in c.cached_on.get(job.checkpoint, ())} if job.checkpoint else set()
    rest = sorted((r for r in c.racks if r not in prefer and view.rack_may_fit(r, u)),
                  key=lambda r: (r not in cached, view.rack_free[r][k], r))
    return [r for r in prefer if view.rack_may_fit(r, u)] + rest


def _fill(view: FreeView, job: Job, order: list[int], racks: list[str] | None, cfg) -> list[int] | None:
    """Place units (largest first) one by one; `racks` None: any rack, preferring those in use."""
    units, needs = job.units, job.needs
    out: list[int | None] = [None] * len(units)
    used: list[str] = []
    orders: dict = {}  # (unit shape, racks in use) -> rack order; the view's rack summaries hold still during a search
    for j in order:
        u = needs[j]
        if racks is not None:
            candidates = racks
        else:
            key = (u, tuple(used))
            candidates = orders.get(key) or orders.setdefault(key, _rack_order(view, u, job, used))
        node = None
        for r in candidates:
            if view.rack_may_fit(r, u):
                node = _best_node(view, r, u, units[j], job, cfg)
                if node is not None:
                    break
        if node is None:
            return None
        view.take(node, u)
        out[j] = node
        rack = view.c.rack_of[node]
        if racks is None and job.checkpoint_gb >= cfg.colocate_gb and rack not in used:
            used.append(rack)
    return out


@PLACEMENT.register("pack")
def pack(view: FreeView, job: Job, cfg) -> list[int] | None:
    needs = job.needs
    order = sorted(range(len(needs)), key=lambda j: (-needs[j][2], -needs[j][0], -needs[j][1], j))
    if job.checkpoint_gb >= cfg.colocate_gb and len(needs) > 1:
        total = job.total
        for r in _rack_order(view, needs[order[0]], job, []):
            if any(view.rack_free[r][k] < total[k] for k in range(3)):
                continue
            snap = view.snapshot()
            got = _fill(view, job, order, [r], cfg)
            if got is not None:
                return got
            view.restore(snap)
    return _fill(view, job, order, None, cfg)
