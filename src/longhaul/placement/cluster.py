"""The resource ledger of a cluster: nodes (CPU, memory, GPUs, a rack label), what each job holds
on each node, what is free, and which checkpoints each node has cached.

`allocate(job_id, [(node, Resources)])` is all or nothing under one lock: it checks every
request against what is free and either takes all of it or raises `Oversubscribed` without
changing anything, so no sequence of allocations and releases can ever put a node over its
capacity (`check()` verifies the books). Amounts are kept as integers (milli-CPUs, MiB, GPUs)
so the books balance exactly. Choosing nodes is `placement`; ordering jobs is `placer`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Resources:
    cpus: float = 0.0
    mem_gb: float = 0.0
    gpus: int = 0

    def __post_init__(self):
        if self.cpus < 0 or self.mem_gb < 0 or self.gpus < 0:
            raise ValueError(f"resources must be >= 0, got {self}")

    def units(self) -> tuple[int, int, int]:
        """(milli-CPUs, MiB, GPUs): the exact integer form the ledger counts in."""
        return (round(self.cpus * 1000), round(self.mem_gb * 1024), int(self.gpus))

    @staticmethod
    def of(units: tuple[int, int, int]) -> "Resources":
        return Resources(units[0] / 1000, units[1] / 1024, units[2])


@dataclass(frozen=True)
class Node:
    name: str
    capacity: Resources
    rack: str = "rack-0"  # topology label: units of one job in one rack share its switch


class Oversubscribed(RuntimeError):
    """An allocation asked for more than a node has free (a placement bug: nothing was taken)."""


class Cluster:
    def __init__(self, nodes: list[Node], cache_slots: int = 2):
        if len({n.name for n in nodes}) != len(nodes):
            raise ValueError("node names must be unique")
        self.nodes = list(nodes)
        self.cap = [n.capacity.units() for n in nodes]
        self.free = [list(c) for c in self.cap]  # per node [mcpu, mib, gpus]
        self.holdings: dict[str, list[tuple[int, tuple[int, int, int]]]] = {}  # job id -> [(node, units)]
        self.node_jobs: list[set[str]] = [set() for _ in nodes]
        self.racks: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            self.racks.setdefault(n.rack, []).append(i)
        self.rack_of = [n.rack for n in nodes]
        self.rack_gpu = {r: [i for i in m if self.cap[i][2] > 0] for r, m in self.racks.items()}  # GPU nodes of each rack
        self.rack_cpu = {r: [i for i in m if self.cap[i][2] == 0] for r, m in self.racks.items()}  # CPU-only nodes
        self.rack_max: dict[str, tuple] = {}  # per rack, the largest free amount of each kind on one node
        self.rack_free: dict[str, tuple] = {}  # per rack, the free amount of each kind summed over its nodes
        for r in self.racks:
            self._summarise(r)
        self.total = tuple(sum(c[k] for c in self.cap) for k in range(3))
        self.free_total = list(self.total)
        self.cache_slots = cache_slots
        self.cached: list[OrderedDict] = [OrderedDict() for _ in nodes]  # node -> checkpoint keys, least recent first
        self.cached_on: dict[str, set[int]] = {}  # checkpoint key -> nodes holding it
        self._lock = threading.Lock()

    def _summarise(self, rack: str) -> None:
        members = self.racks[rack]
        self.rack_max[rack] = tuple(max(self.free[i][k] for i in members) for k in range(3))
        self.rack_free[rack] = tuple(sum(self.free[i][k] for i in members) for k in range(3))

    def fits(self, i: int, u: tuple[int, int, int]) -> bool:
        f = self.free[i]
        return f[0] >= u[0] and f[1] >= u[1] and f[2] >= u[2]

    def allocate(self, job_id: str, requests: list[tuple[int, Resources]]) -> None:
        """Take every request or none; a job holds one allocation at a time."""
        need: dict[int, list[int]] = {}
        for i, r in requests:
            u = r.units()
            acc = need.setdefault(i, [0, 0, 0])
            for k in range(3):
                acc[k] += u[k]
        with self._lock:
            if job_id in self.holdings:
                raise Oversubscribed(f"job {job_id!r} already holds resources; release it before allocating again")
            for i, u in need.items():
                if not self.fits(i, u):
                    raise Oversubscribed(f"node {self.nodes[i].name} has {Resources.of(tuple(self.free[i]))} free, "
                                         f"job {job_id!r} asked for {Resources.of(tuple(u))}")
            for i, u in need.items():
                for k in range(3):
                    self.free[i][k] -= u[k]
                    self.free_total[k] -= u[k]
                self.node_jobs[i].add(job_id)
            self.holdings[job_id] = [(i, tuple(u)) for i, u in need.items()]
            for r in {self.rack_of[i] for i in need}:
                self._summarise(r)

    def release(self, job_id: str) -> list[tuple[int, tuple[int, int, int]]]:
        """Give back everything `job_id` holds; returns what it held (empty if nothing)."""
        with self._lock:
            held = self.holdings.pop(job_id, [])
            for i, u in held:
                for k in range(3):
                    self.free[i][k] += u[k]
                    self.free_total[k] += u[k]
                self.node_jobs[i].discard(job_id)
            for r in {self.rack_of[i] for i, _ in held}:
                self._summarise(r)
            return held

    def note_checkpoint(self, i: int, key: str) -> None:
        """Node `i` loaded checkpoint `key`; it keeps the `cache_slots` most recent ones."""
        if not key:
            return
        c = self.cached[i]
        c[key] = None
        c.move_to_end(key)
        self.cached_on.setdefault(key, set()).add(i)
        while len(c) > self.cache_slots:
            old, _ = c.popitem(last=False)
            self.cached_on[old].discard(i)

    def has_checkpoint(self, i: int, key: str) -> bool:
        return bool(key) and key in self.cached[i]

    def used_fraction(self) -> tuple[float, float, float]:
        """Allocated fraction of all CPUs, memory and GPUs."""
        return tuple((t - f) / t if t else 0.0 for t, f in zip(self.total, self.free_total))

    def check(self) -> None:
        """Raise if the books do not balance or any node is over capacity."""
        held = [[0, 0, 0] for _ in self.nodes]
        for job_id, parts in self.holdings.items():
            for i, u in parts:
                for k in range(3):
                    held[i][k] += u[k]
        for i, n in enumerate(self.nodes):
            for k in range(3):
                if held[i][k] > self.cap[i][k] or self.free[i][k] != self.cap[i][k] - held[i][k] or self.free[i][k] < 0:
                    raise Oversubscribed(f"node {n.name}: capacity {self.cap[i]}, held {held[i]}, free {self.free[i]}")
        for r in self.racks:
            members = self.racks[r]
            if self.rack_max[r] != tuple(max(self.free[i][k] for i in members) for k in range(3)) or \
                    self.rack_free[r] != tuple(sum(self.free[i][k] for i in members) for k in range(3)):
                raise Oversubscribed(f"rack {r}: stale free-capacity summary")
        if tuple(self.free_total) != tuple(sum(f[k] for f in self.free) for k in range(3)):
            raise Oversubscribed("cluster: free totals do not match the nodes")
