"""Placement on Ray: a job's units become one placement group, one bundle a unit.

`bundles(job)` turns units into bundle dicts (`CPU`, `GPU`, `memory` in bytes); given the
`Placer`'s decision (`run`), `pins(run, cluster)` gives each bundle a label selector on Ray's
node ID (`ray.io/node-id`) that holds it on the node the placer chose (an address would not
do: several raylets may share one host), so Ray reserves exactly what the placer locked. `strategy(job, cfg)` is the
matching Ray strategy when no decision is given: STRICT_PACK (one node) for a gang whose
checkpoint is large and that fits on one node, otherwise PACK. `nodes_from_ray()` reads the
live Ray cluster into `Node`s named by node ID (the rack from the node label `rack`, as
`ray start --labels rack=r1` sets it, else from a `rack:<label>` custom resource, as
`ray start --resources='{"rack:r1": 1}'` sets it); `usage_from_ray()` what Ray counts as in use
on each node (its load, whoever put it there). `reserve` creates the group and
waits for it; `actor_options` gives the `.options(...)` of the actor that runs a unit.

Ray is imported inside the functions that need it (the `ray` extra).
"""

from __future__ import annotations

from longhaul.errors import LonghaulError
from longhaul.placement.cluster import Cluster, Node, Resources
from longhaul.placement.placement import Job, Running
from longhaul.placement.placer import PlacerConfig

PIN = 0.001  # CPUs of a bundle that asks for nothing: Ray refuses an empty bundle
GIB = 1024 ** 3
NODE_ID = "ray.io/node-id"  # the label every Ray node carries


def unit_bundle(needs: Resources) -> dict:
    out = {"CPU": needs.cpus, "GPU": needs.gpus, "memory": int(needs.mem_gb * GIB)}
    out = {k: v for k, v in out.items() if v}
    return out or {"CPU": PIN}  # Ray refuses an empty bundle


def bundles(job: Job) -> list[dict]:
    """One bundle per unit."""
    return [unit_bundle(u.needs) for u in job.units]


def pins(run: Running, cluster: Cluster) -> list[dict]:
    """Each unit's label selector: the node (a `nodes_from_ray` name) the placer put it on."""
    return [{NODE_ID: cluster.nodes[i].name} for i in run.nodes]


def strategy(job: Job, cfg: PlacerConfig = PlacerConfig(), node: Resources | None = None) -> str:
    """STRICT_PACK for large weights whose gang fits on one node of shape `node`, else PACK."""
    if job.checkpoint_gb >= cfg.colocate_gb and node is not None:
        t = Resources.of(job.total)
        if t.cpus <= node.cpus and t.mem_gb <= node.mem_gb and t.gpus <= node.gpus:
            return "STRICT_PACK"
    return "PACK"


def nodes_from_ray() -> list[Node]:
    """The alive nodes of the connected Ray cluster, named by node ID (what `pins` selects)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res, labels = n["Resources"], n.get("Labels") or {}
        rack = labels.get("rack") or next((k.split(":", 1)[1] for k in sorted(res) if k.startswith("rack:")), "rack-0")
        out.append(Node(n["NodeID"], Resources(res.get("CPU", 0.0), res.get("memory", 0.0) / GIB, int(res.get("GPU", 0))), rack))
    return out


def usage_from_ray() -> dict[str, Resources]:
    """What Ray counts as in use on each alive node, by node ID: the resources its actors and
    tasks hold and its placement groups reserve (whoever created them)."""
    import ray
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node()
    out = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        total, left = n["Resources"], free.get(n["NodeID"], {})
        used = {k: max(0.0, total.get(k, 0.0) - left.get(k, 0.0)) for k in ("CPU", "memory", "GPU")}
        out[n["NodeID"]] = Resources(used["CPU"], used["memory"] / GIB, int(round(used["GPU"])))
    return out


def group_name(job_id: str) -> str:
    """The name of a job's placement group (`reserve` gives it; a restarted queue finds it by it)."""
    return f"longhaul-{job_id}"


def reserve(job: Job, run: Running | None = None, cluster: Cluster | None = None, cfg: PlacerConfig = PlacerConfig(),
            timeout_s: float = 60.0, lifetime: str | None = None):
    """Create the job's placement group (pinned to the placer's nodes when `run` and `cluster`
    are given) and wait until Ray has reserved every bundle. `lifetime="detached"` keeps it after
    the creating process ends (the job queue's runs outlive a restart of the queue)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bs = bundles(job)
    if run is not None and cluster is None:
        raise ValueError("pinning bundles to the placer's nodes needs the cluster they were placed on")
    strat = "PACK" if run is not None else strategy(job, cfg)
    pg = placement_group(bs, strategy=strat, name=group_name(job.id), lifetime=lifetime,
                         bundle_label_selector=pins(run, cluster) if run is not None else None)
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
