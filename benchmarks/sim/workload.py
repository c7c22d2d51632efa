"""A synthetic but realistic workload of a shared post-training cluster: nodes, domains, jobs.

Every number here is an assumption, stated in `WorkloadSpec` and docs/scheduling.md; the same
job list (arrivals, sizes, durations) goes through every policy, so a comparison differs only
in the policy. What it models:
- Cluster: `nodes` nodes in `racks` racks, each rack 60% GPU nodes (8 GPUs, 96 CPUs, 1 TiB)
  and 40% CPU nodes (128 CPUs, 512 GiB) behind one switch; CPU nodes come first in each rack.
- Domains: weights lognormal(0, 0.8); priorities 2 (5%), 1 (80%), 0 (15%, best effort);
  demand (share of arrivals) lognormal(0, 1) *independent of the weight*, so what domains ask
  for differs from what they are entitled to; a policy model (checkpoint 3/16/64/140 GB, with
  1/1/4/8 GPUs a worker) with probabilities 0.3/0.4/0.2/0.1; sandbox intensity 0.5-4 pools a worker.
- Jobs: rollout batches (70%: 1/2/4 inference workers and their sandbox pools of 16 CPUs,
  lognormal duration, median 15 min, sigma 1), evaluations (25%: one worker, twice the pools,
  median 8 min, sigma 0.8) and training runs (5%: 1/2/4/8 whole GPU nodes, median 2 h,
  sigma 0.7). Rollout batches and evaluations are elastic (`Job.elastic`: their workers are
  independent; a placer with `split_elastic` runs them as shards), training runs are gangs
  (with `replicated_training`, data-parallel replicas a node, `placement.Replica`, which such a
  placer grows and shrinks: a replica leaving or joining costs its peers `REPLICA_LEAVE_S`).
  Durations are clipped to [1 min, 24 h]. Work survives pre-emption at a checkpoint every 5 min
  (rollouts, evaluations) or 30 min (training); a training run told of its pre-emption saves
  everything instead, in `notice_save_s`: its weights and Adam state (3x the
  checkpoint), sharded over its nodes, each node writing its part at `STORAGE_GBPS` (2 GB/s, the
  rate each unit loads at), plus 60 s to finish its step and exit (on one node 64 s for 3 GB
  weights, 84 s for 16, 156 s for 64, 270 s for 140; on 8 nodes 61, 63, 72 and 86 s).
  `notice_save_s` replaces that with one save time for every job (a what-if, not a model: with
  a second or so, pre-emption costs next to nothing, which bounds what its cost explains).
- Arrivals: one Poisson process whose rate follows a daily cycle (+-`diurnal`), domains
  chosen by demand; 3% of arrivals are sweeps of 5-40 identical jobs at once. The mean rate is
  set so the offered GPU load is `load` times the GPU capacity (peaks above it, troughs below);
  checkpoint loads, cross-rack slowdowns and fragmentation come on top, so near 0.95 the queues
  of every policy grow without bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from longhaul.placement.cluster import Node, Resources
from longhaul.placement.placement import Job, Replica, WorkUnit

MODELS = ((3.0, 1, 0.3), (16.0, 1, 0.4), (64.0, 4, 0.2), (140.0, 8, 0.1))  # (checkpoint GB, GPUs a worker, probability)
GPU_NODE = Resources(cpus=96, mem_gb=1024, gpus=8)
CPU_NODE = Resources(cpus=128, mem_gb=512, gpus=0)
SANDBOX = Resources(cpus=16, mem_gb=32)
KINDS = (("rollout", 0.70, 15 * 60, 1.0), ("eval", 0.25, 8 * 60, 0.8), ("train", 0.05, 2 * 3600, 0.7))  # (kind, p, median s, sigma)
CHECKPOINT_EVERY_S = {"rollout": 300.0, "eval": 300.0, "train": 1800.0}  # work saved at this cadence survives pre-emption
SAVES_ON_NOTICE = {"rollout": False, "eval": False, "train": True}  # told of a pre-emption, it saves everything (SIGTERM -> checkpoint)
STORAGE_GBPS = 2.0  # shared storage, read (cluster_sim.REMOTE_GBPS) and written alike
TRAIN_STATE_X = 3.0  # a training checkpoint is weights + Adam's two moments: 3x the weights
REPLICA_LEAVE_S = 30.0  # a replica of a replicated training run leaving or joining: its peers drop the step in flight and regroup
NOTICE_OVERHEAD_S = 60.0  # on top of the write: finishing the current step, flushing, exiting (counted as lost, though the step's work is kept)


def notice_save_s(kind: str, checkpoint_gb: float, nodes: int = 1) -> float | None:
    """How long a job of `kind` on `nodes` nodes takes to save on notice (None: it does not, it
    keeps only its cadence saves). Each node writes its shard of the state at `STORAGE_GBPS`, the
    rate each unit loads at (a sharded checkpoint: every rank writes its own part)."""
    return NOTICE_OVERHEAD_S + TRAIN_STATE_X * checkpoint_gb / (STORAGE_GBPS * nodes) if SAVES_ON_NOTICE[kind] else None


@dataclass(frozen=True)
class WorkloadSpec:
    nodes: int = 1000
    racks: int = 40
    domains: int = 300
    hours: float = 72.0  # arrivals over this long
    warmup_hours: float = 6.0  # excluded from the measurements (the cluster starts empty)
    # a draw offers its own load around this mean (seeds 0-3: 0.859, 0.827, 0.928, 0.807; the benchmark reports it)
    load: float = 0.85  # mean offered GPU load / GPU capacity: busy but stable (peaks 1.15x, troughs 0.55x); 0.95 overloads it
    diurnal: float = 0.35  # arrival rate swings +-35% over a day
    sweep_prob: float = 0.03
    seed: int = 0
    replicated_training: bool = False  # training runs are data-parallel replicas a node (placement.Replica): a placer with split_elastic grows and shrinks them (measured, not kept: docs/scheduling.md)
    notice_save_s: float | None = None  # a what-if: every job, whatever its kind, saves on notice in this long (near 0: pre-emption costs next to nothing); None: as modelled


@dataclass(frozen=True)
class DomainSpec:
    name: str
    weight: float
    priority: int
    demand: float
    checkpoint_gb: float
    worker_gpus: int
    sandbox_per_worker: float


@dataclass
class SimJob:
    job: Job
    arrival: float
    work_s: float  # at full speed, after loading
    kind: str


def make_nodes(spec: WorkloadSpec) -> list[Node]:
    per = math.ceil(spec.nodes / spec.racks)
    nodes = []
    for r in range(spec.racks):
        n = min(per, spec.nodes - r * per)
        n_cpu = round(0.4 * n)
        nodes += [Node(f"r{r:02d}-c{k:02d}", CPU_NODE, f"rack-{r:02d}") for k in range(n_cpu)]
        nodes += [Node(f"r{r:02d}-g{k:02d}", GPU_NODE, f"rack-{r:02d}") for k in range(n - n_cpu)]
    return nodes


def make_domains(spec: WorkloadSpec, rng: random.Random) -> list[DomainSpec]:
    out = []
    for d in range(spec.domains):
        u = rng.random()
        priority = 2 if u < 0.05 else (0 if u > 0.85 else 1)
        ckpt, gpus, _ = rng.choices(MODELS, weights=[m[2] for m in MODELS])[0]
        out.append(DomainSpec(f"domain-{d:03d}", rng.lognormvariate(0, 0.8), priority, rng.lognormvariate(0, 1.0),
                              ckpt, gpus, rng.uniform(0.5, 4.0)))
    return out


def _job(rng: random.Random, d: DomainSpec, kind: str, jid: str, t: float, save_s: float | None = None,
         replicated: bool = False) -> tuple[Job, float]:
    median, sigma = next((m, s) for k, _, m, s in KINDS if k == kind)
    work = min(max(rng.lognormvariate(math.log(median), sigma), 60.0), 24 * 3600.0)
    if kind == "train":
        units = (WorkUnit("trainer", GPU_NODE),) * rng.choices((1, 2, 4, 8), weights=(0.4, 0.3, 0.2, 0.1))[0]
    else:
        workers = 1 if kind == "eval" else rng.choice((1, 2, 4))
        pools = max(1, round(workers * d.sandbox_per_worker * (2 if kind == "eval" else 1)))
        worker = WorkUnit("rollout", Resources(cpus=6 * d.worker_gpus, mem_gb=64 * d.worker_gpus, gpus=d.worker_gpus))
        units = (worker,) * workers + (WorkUnit("sandbox", SANDBOX, loads_checkpoint=False),) * pools
    replica = None
    if kind == "train" and replicated:  # a replica alone saves the whole state from one node
        replica = Replica(REPLICA_LEAVE_S, notice_save_s(kind, d.checkpoint_gb, 1) if save_s is None else save_s)
    return Job(jid, d.name, units, d.priority, d.checkpoint_gb, f"{d.name}/policy", True, t, CHECKPOINT_EVERY_S[kind],
               notice_save_s(kind, d.checkpoint_gb, len(units)) if save_s is None else save_s,
               elastic=kind != "train" or replica is not None, replica=replica), work


def _gpu_seconds(job: Job, work: float) -> float:
    return job.total[2] * work


def make_jobs(spec: WorkloadSpec, domains: list[DomainSpec], rng: random.Random) -> list[SimJob]:
    """Arrivals over `spec.hours`, scaled so the mean offered GPU load is `spec.load`."""
    demand = [d.demand for d in domains]
    kinds, kind_p = [k for k, *_ in KINDS], [p for _, p, *_ in KINDS]
    probe = random.Random(spec.seed + 7)  # estimate GPU-seconds a job (sweeps included) without touching `rng`
    per_job = sum(_gpu_seconds(*_job(probe, probe.choices(domains, demand)[0], probe.choices(kinds, kind_p)[0], "", 0.0))
                  for _ in range(20000)) / 20000
    jobs_per_arrival = 1 + spec.sweep_prob * (22.5 - 1)  # sweeps of 5..40 jobs
    capacity_gpus = sum(n.capacity.gpus for n in make_nodes(spec))
    rate = spec.load * capacity_gpus / per_job / jobs_per_arrival  # arrivals per second, on average
    peak = rate * (1 + spec.diurnal)
    out: list[SimJob] = []
    t, horizon = 0.0, spec.hours * 3600.0
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        if rng.random() > (1 + spec.diurnal * math.sin(2 * math.pi * t / 86400.0)) / (1 + spec.diurnal):
            continue  # thinning: the daily cycle
        d = rng.choices(domains, demand)[0]
        kind = rng.choices(kinds, kind_p)[0]
        count = rng.randint(5, 40) if rng.random() < spec.sweep_prob else 1
        for _ in range(count):
            job, work = _job(rng, d, kind, f"j{len(out):06d}", t, spec.notice_save_s, spec.replicated_training)
            out.append(SimJob(job, t, work, kind))


def make_workload(spec: WorkloadSpec) -> tuple[list[Node], list[DomainSpec], list[SimJob]]:
    rng = random.Random(spec.seed)
    domains = make_domains(spec, rng)
    return make_nodes(spec), domains, make_jobs(spec, domains, rng)
