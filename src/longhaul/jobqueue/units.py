"""What a queued run asks of the cluster, unit by unit, and how its own Ray actors find their
bundles of the run's placement group.

A run is its `longhaul train` process (the driver: the submission's `--cpus`, `--mem-gb`,
`--gpus`) and, where its config runs on Ray (`runtime.backend: ray`), the actors it starts: the
trainer actor (`runtime.trainer_actor`: `trainer_cpus`, `trainer_gpus`, `trainer_memory_gb`),
`runtime.workers` rollout actors (`worker_cpus`, `worker_memory_gb`) and `runtime.sandbox_pools`
sandbox pools (`sandbox_cpus`, `sandbox_memory_gb`). Each is a unit the placer places and a
bundle of the run's placement group, pinned to its node. The service starts the driver in
bundle 0 and tells its process where the other bundles are (`PLACEMENT_ENV`: the group's
namespace and name, the bundle indices of each kind); `placed(kind, k)` gives the run's k-th
actor of a kind the scheduling options of its bundle, so Ray starts it where the placer said.
"""

from __future__ import annotations

import json
import math
import os

PLACEMENT_ENV = "LONGHAUL_PLACEMENT"


def run_units(cfg, cpus: float, mem_gb: float, gpus: int) -> list[dict]:
    """The run's units in bundle order (the driver first), each {kind, cpus, mem_gb, gpus}."""
    units = [{"kind": "driver", "cpus": cpus, "mem_gb": mem_gb, "gpus": gpus}]
    rt = cfg.runtime
    if rt.backend != "ray":
        return units
    if rt.trainer_actor:
        units.append({"kind": "trainer", "cpus": rt.trainer_cpus, "mem_gb": rt.trainer_memory_gb or 0.0,
                      "gpus": math.ceil(rt.trainer_gpus)})
    units += [{"kind": "rollout", "cpus": rt.worker_cpus, "mem_gb": rt.worker_memory_gb or 0.0, "gpus": 0}
              for _ in range(rt.workers)]
    units += [{"kind": "sandbox", "cpus": rt.sandbox_cpus, "mem_gb": rt.sandbox_memory_gb or 0.0, "gpus": 0}
              for _ in range(rt.sandbox_pools)]
    return units


def placement_env(namespace: str, group: str, units: list[dict]) -> dict[str, str]:
    """The environment that tells a run's process where its actors' bundles are."""
    bundles: dict[str, list[int]] = {}
    for i, u in enumerate(units):
        bundles.setdefault(u["kind"], []).append(i)
    return {PLACEMENT_ENV: json.dumps({"namespace": namespace, "group": group, "bundles": bundles})}


def placement_spec() -> dict | None:
    """This process's placement (set by the queue service for a run it started), or None."""
    raw = os.environ.get(PLACEMENT_ENV)
    return json.loads(raw) if raw else None


def placed(kind: str, k: int) -> dict:
    """`.options(**placed(kind, k))` starts the run's k-th actor of `kind` in its bundle of the
    run's placement group (a replacement of actor k in the same one); {} outside a queued run or
    for a kind the run was not placed with."""
    spec = placement_spec()
    index = (spec or {}).get("bundles", {}).get(kind)
    if not index:
        return {}
    from ray.util import get_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_placement_group(spec["group"])
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index[k % len(index)])}
