"""What the placer's parts share: its settings (`PlacerConfig`) and one explicit state
(`PlacerState`): the cluster, the queues, the running and saving jobs, the use each domain made,
the reservations, the pre-emption counts and the caches a pass reads, with the few quantities
that follow from them alone (a job's charge, a domain's level, a class's floor).

It owns the data and those read-only views of it; every change to it is one of the parts':
`books.py` moves jobs between queued, running and saving, `holds.py` reserves nodes,
`preemption.py` chooses victims, `handover.py` hands a told victim's nodes over, and `placer.py`
orders the jobs of a pass. What each setting does is described where it is used.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from longhaul.config import Section
from longhaul.placement.cluster import Cluster
from longhaul.placement.entitlement import Entitlements
from longhaul.placement.placement import Job, Running
from longhaul.placement.usage import Usage


class PlacerConfig(Section):
    order: Literal["fair", "fifo"] = "fair"
    share: Literal["gpu", "dominant"] = "gpu"  # what the weights share out: GPU-hours, or the dominant resource (weighted DRF)
    policy: str = "pack"  # node choice (longhaul.placement.placement): pack, first_fit
    backfill: bool = True  # try jobs behind one that does not fit
    preempt: bool = True  # a waiting job may evict strictly lower-priority pre-emptible jobs
    preempt_after_s: float = Field(60.0, ge=0)  # let natural departures make room first
    reserve_after_s: float | None = Field(1800.0, ge=0)  # drain nodes for a head that has waited this long; None: never
    max_reservations: int = Field(4, ge=0)  # jobs with drained nodes at a time (each idles nodes while they drain)
    colocate_gb: float = Field(32.0, ge=0)  # checkpoints this large keep a job's units in one rack when possible
    cpus_per_gpu: float = Field(4.0, ge=0)  # CPUs CPU-only work must leave beside each free GPU of a GPU node
    scan_limit: int = Field(256, ge=1)  # placement attempts per pass (like Slurm's bf_max_job_test)
    preempt_tries: int = Field(4, ge=1)  # pre-emption searches per pass (each weighs every node), highest priority first
    instant_first: bool = False  # search first among victims that go at once (killed, not told to save), then among all
    usage_half_life_s: float | None = Field(3 * 3600.0, gt=0)  # fair share counts past use, decayed with this half-life (longhaul.placement.usage); None: the share held now only
    usage_lookahead_s: float = Field(600.0, ge=0)  # a job counts as this much use the moment it starts (no burst of one domain in one pass)
    fair_preempt_after_s: float | None = Field(None, ge=0)  # a head waiting this long may evict jobs of over-share domains of its own priority; None: never
    fair_preempt_max_loss_s: float | None = Field(None, ge=0)  # fair-share victims have at most this much unsaved work (they saved recently); None: any
    preempt_keeps_progress: bool = False  # fair-share victims, and priority victims killed before, keep work of their run: told, or saved since they started (no job evicted without getting on, no cap)
    fair_preempt_max_save_s: float | None = Field(None, ge=0)  # ... but victims told to save (handover.py) only a save at most this long; None: as above
    max_preemptions: int | None = Field(2, ge=0)  # a job killed this often is not evicted again (no job starves restarting; told victims keep their work and do not count); None: no cap
    domain_scan: int = Field(4, ge=1)  # jobs of one domain tried behind its blocked head
    hold_for_first: bool = False  # a blocked head of the domain served first keeps its GPUs free from jobs ranked after it for the pass (non-work-conserving; holds.py)
    queue_order: Literal["submitted", "smallest"] = "submitted"  # within a domain (fair order): submission order, or fewest GPUs first (fewer jobs wait behind a gang; the domain's share is the same)
    entitled_preempt: bool = False  # fair-share pre-emption only for domains under their entitlement (entitlement.py), of jobs of domains over theirs, least unsaved work first
    min_class_share: float = Field(0.0, ge=0, le=0.5)  # a priority class with waiting jobs is guaranteed this share of the GPUs (no starvation under strict priorities); 0: strict
    split_elastic: bool = False  # an elastic job (Job.elastic: a rollout batch's independent workers) is queued as its shards (placement.shards): its workers start as room frees and are pre-empted one by one, not as one gang
    notice: bool = False  # victims that save on notice (Job.notice_save_s) are told, and keep their nodes while they save, when that loses less than killing them (handover.py); off: killed


@dataclass(eq=False)
class PlacerState:
    c: Cluster
    cfg: PlacerConfig
    weights: dict[str, float] = field(default_factory=dict)  # domain -> its weight within its priority class (default 1)
    # queued
    queues: dict[str, deque[Job]] = field(default_factory=lambda: defaultdict(deque))  # domain (or "" for fifo) -> waiting jobs
    jobs: dict[str, Job] = field(default_factory=dict)  # queued jobs by id
    waiting_since: dict[str, float] = field(default_factory=dict)
    # running and saving
    running: dict[str, Running] = field(default_factory=dict)
    by_priority: dict[int, dict[str, Running]] = field(default_factory=lambda: defaultdict(dict))  # running pre-emptible jobs
    stopping: dict[str, tuple[Running, float]] = field(default_factory=dict)  # told victims saving -> (their run, when the save ends)
    awaiting: dict[str, tuple[list[int], float, list[str]]] = field(default_factory=dict)  # queued head -> (its nodes, when its victims have saved, them)
    replicas_running: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # replicated training run (Job.replica) -> its shards running
    class_held: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # priority class -> share its running jobs hold (for `min_class_share`)
    # reservations (holds.py)
    reserved: dict[str, set[int]] = field(default_factory=dict)  # job id -> drained nodes, oldest first
    node_reserved: dict[int, str] = field(default_factory=dict)
    # pre-emptions
    preemptions: int = 0
    evictions: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # job id -> times pre-empted
    kills: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # job id -> times pre-empted without notice (work since its last save lost)
    # the pass
    clock: float = 0.0  # time of the latest pass
    preempt_left: int = 0  # pre-emption searches left this pass
    failed: set = field(default_factory=set)  # shapes that did not fit since resources last came back (free only shrinks meanwhile)
    candidates: dict = field(default_factory=dict)  # priority (or (priority, now): those killed at once) -> (victim runs, what evicting them frees per node, its rack summaries, their total), until resources change
    failed_preempt: set = field(default_factory=set)  # (mode, shape, priority, level) that pre-emption could not place, likewise
    # use, from the settings
    usage: Usage = field(init=False)  # domain -> share held now and recently (what the weights share out)
    entitled: Entitlements = field(init=False)  # domain -> its weighted max-min share of its class's use

    def __post_init__(self) -> None:
        self.usage = Usage(self.cfg.usage_half_life_s, self.cfg.usage_lookahead_s)
        self.entitled = Entitlements(self.cfg.usage_half_life_s, self.weights)

    @property
    def entitling(self) -> bool:
        """Whether anything reads the entitlements (only `entitled_preempt` does): else they are not kept."""
        return self.cfg.entitled_preempt

    def dominant(self, job: Job) -> float:
        """The job's largest fraction of the cluster's CPUs, memory or GPUs (its DRF share)."""
        return max(job.total[k] / self.c.total[k] for k in range(3) if self.c.total[k])

    def charge(self, job: Job) -> float:
        """What a running job counts against its domain's weight: its fraction of the GPUs (or,
        with `share: dominant` or on a cluster without GPUs, its dominant share)."""
        if self.cfg.share == "gpu" and self.c.total[2]:
            return job.total[2] / self.c.total[2]
        return self.dominant(job)

    def level(self, d: str, now: float, extra: float = 0.0) -> float:
        """Domain `d`'s recent use (as if it held `extra` more now), per unit of weight: the
        fair-share order serves the lowest first."""
        return self.usage.level(d, now, extra) / self.weights.get(d, 1.0)

    def below_floor(self, priority: int, less: float = 0.0) -> bool:
        """Whether class `priority` holds (after giving up `less`) under its `min_class_share`."""
        return self.class_held[priority] - less < self.cfg.min_class_share - 1e-12

    def evictable(self, job: Job) -> bool:
        """Whether `job` may be pre-empted: it is pre-emptible and was not killed `max_preemptions` times."""
        cap = self.cfg.max_preemptions
        return job.preemptible and (cap is None or self.kills.get(job.id, 0) < cap)

    def shape(self, job: Job) -> tuple:
        """What decides whether a job fits where another did not: its units' needs, and whether it keeps to one rack."""
        return tuple(sorted(job.needs)), job.checkpoint_gb >= self.cfg.colocate_gb
