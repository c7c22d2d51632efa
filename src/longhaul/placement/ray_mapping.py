"""Placement on Ray: a job's units become one placement group, one bundle a unit.

`bundles(job, run, cluster)` turns units into bundle dicts (`CPU`, `GPU`, `memory` in bytes);
given the `Placer`'s decision (`run`), each bundle is also pinned to its node with Ray's
`node:<ip>` resource, so Ray reserves exactly what the placer locked. `strategy(job, cfg)` is
the matching Ray strategy when no decision is given: STRICT_PACK (one node) for a gang whose
checkpoint is large and that fits on one node, otherwise PACK. `nodes_from_ray()` reads the
live Ray cluster into `Node`s (the rack label from a `rack:<label>` custom resource, as set by
`ray start --resources='{"rack:r1": 1}'`). `reserve` creates the group and waits for it;
`actor_options` gives the `.options(...)` of the actor that runs a unit.

Ray is imported inside the functions that need it (the `ray` extra).
"""

from __future__ import annotations

from longhaul.errors import LonghaulError
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, Running
from longhaul.placement.placer import PlacerConfig

PIN = 0.001  # of a node's `node:<ip>` resource: enough to pin a bundle, never enough to exhaust it
GIB = 1024 ** 3


def unit_bundle(needs: Resources) -> dict:
    out = {"CPU": needs.cpus, "GPU": needs.gpus, "memory": int(needs.mem_gb * GIB)}
    out = {k: v for k, v in out.items() if v}
    return out or {"CPU": PIN}  # Ray refuses an empty bundle


def bundles(job: Job, run: Running | None = None, cluster: Cluster | None = None) -> list[dict]:
    """One bundle per unit, pinned to the placer's nodes when `run` (and its cluster) are given."""
    out = [unit_bundle(u.needs) for u in job.units]
    if run is not None:
        if cluster is None:
            raise ValueError("pinning bundles to the placer's nodes needs the cluster they were placed on")
        for b, i in zip(out, run.nodes):
            b[f"node:{cluster.nodes[i].name}"] = PIN
    return out


def strategy(job: Job, cfg: PlacerConfig = PlacerConfig(), node: Resources | None = None) -> str:
    """STRICT_PACK for large weights whose gang fits on one node of shape `node`, else PACK."""
    if job.checkpoint_gb >= cfg.colocate_gb and node is not None:
        t = Resources.of(job.total)
        if t.cpus <= node.cpus and t.mem_gb <= node.mem_gb and t.gpus <= node.gpus:
            return "STRICT_PACK"
    return "PACK"


def nodes_from_ray() -> list[Node]:
    """The alive nodes of the connected Ray cluster, named by IP (what `node:<ip>` pins to)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n["Resources"]
        rack = next((k.split(":", 1)[1] for k in sorted(res) if k.startswith("rack:")), "rack-0")
        out.append(Node(n["NodeManagerAddress"], Resources(res.get("CPU", 0.0), res.get("memory", 0.0) / GIB, int(res.get("GPU", 0))), rack))
    return out


def reserve(job: Job, run: Running | None = None, cluster: Cluster | None = None, cfg: PlacerConfig = PlacerConfig(),
            timeout_s: float = 60.0):
    """Create the job's placement group and wait until Ray has reserved every bundle."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bs = bundles(job, run, cluster)
    strat = "PACK" if run is not None else strategy(job, cfg)
    pg = placement_group(bs, strategy=strat, name=f"longhaul-{job.id}")
    if not pg.wait(timeout_s):
        remove_placement_group(pg)
        raise LonghaulError(f"Ray could not reserve job {job.id!r} ({len(bs)} bundles, {strat}) within {timeout_s:g} s; "
                            "the cluster lacks the resources (see `ray status`), or lower the job's needs")
    return pg


def release(pg) -> None:
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(pg)


def actor_options(pg, index: int, job: Job) -> dict:
    """`.options(**actor_options(pg, i, job))` runs unit `i` inside its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    needs = job.units[index].needs
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
            "num_cpus": needs.cpus, "num_gpus": needs.gpus, **({"memory": int(needs.mem_gb * GIB)} if needs.mem_gb else {})}
