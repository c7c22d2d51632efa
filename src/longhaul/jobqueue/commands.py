"""`longhaul queue start | stop | status | cancel` and `longhaul submit`: the job queue's commands,
each a client of the queue service (`service.py`) on an existing Ray cluster (`ray start --head`;
`--address` as `ray.init` takes it, `auto` by default). The service, the placer and the config
models are imported by the commands that need them: `longhaul --help` stays light."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from longhaul.errors import LonghaulError
from longhaul.home import cache_home
from longhaul.jobqueue.runner import NAMESPACE, SERVICE_NAME

queue_app = typer.Typer(no_args_is_help=True, help="The job queue on a Ray cluster: runs of many domains, placed and pre-empted.")
ADDRESS = typer.Option("auto", "--address", help="the Ray cluster (`ray start --head` first), as ray.init takes it")


def connect(address: str) -> None:
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise LonghaulError(f"no Ray cluster at {address!r} ({str(e).splitlines()[0][:120]}); start one with `ray start --head` "
                            "or pass --address host:port") from None


def service(address: str):
    """The running queue service's handle."""
    import ray

    connect(address)
    try:
        return ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
    except ValueError:
        raise LonghaulError("no queue service on this Ray cluster; start it with `longhaul queue start`") from None


def call(method, *args):
    """A service call; its refusals come back as the one line they are."""
    import ray

    try:
        return ray.get(method.remote(*args), timeout=300)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
        if isinstance(cause, LonghaulError):
            raise LonghaulError(str(cause)) from None
        raise


def placer_settings(pairs: list[str]) -> dict:
    from pydantic import ValidationError

    from longhaul.placement.placer import PlacerConfig

    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise LonghaulError(f"--placer takes key=value, got {pair!r} (e.g. --placer preempt_after_s=30)")
        try:
            out[key] = json.loads(value)  # numbers, true/false, null
        except json.JSONDecodeError:
            out[key] = value  # a word: a policy or an order
    try:
        return PlacerConfig(**out).model_dump()
    except ValidationError as e:
        err = e.errors()[0]
        raise LonghaulError(f"--placer {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


@queue_app.command("start")
def start(address: str = ADDRESS,
          home: Optional[Path] = typer.Option(None, "--home", help="the queue's files: its database and each run's directory "
                                                                   "(default $LONGHAUL_HOME/queue; on a cluster, a shared path)"),
          placer: list[str] = typer.Option([], "--placer", help="placer setting key=value (longhaul.placement.PlacerConfig), repeatable"),
          pass_every_s: float = typer.Option(1.0, "--pass-every-s", help="seconds between scheduling passes"),
          stop_grace_s: float = typer.Option(120.0, "--stop-grace-s", help="a pre-empted run's time to save before SIGKILL"),
          metrics_port: int = typer.Option(0, "--metrics-port", help="port of the service's /metrics (0: any free one; -1: none)")):
    """Start the queue service on this node of the cluster (it outlives this command)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from longhaul.jobqueue.service import QueueService

    settings = placer_settings(placer)
    if pass_every_s <= 0 or stop_grace_s <= 0:
        raise LonghaulError("--pass-every-s and --stop-grace-s must be > 0")
    connect(address)
    try:
        ray.get_actor(SERVICE_NAME, namespace=NAMESPACE)
        raise LonghaulError("a queue service already runs on this cluster; `longhaul queue stop` it first")
    except ValueError:
        pass
    root = (home or cache_home() / "queue").resolve()
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    svc = ray.remote(QueueService).options(name=SERVICE_NAME, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
                                           max_concurrency=8, scheduling_strategy=here)
    handle = svc.remote(str(root / "queue.sqlite"), str(root), settings, pass_every_s, stop_grace_s, metrics_port)
    state = call(handle.status)
    port = state["metrics_port"]
    print(f"queue service started: {len(state['runs'])} runs on the books, {len(state['nodes'])} nodes; database "
          f"{root / 'queue.sqlite'}" + (f"; metrics on port {port} (/metrics)" if port else ""))


@queue_app.command("stop")
def stop(address: str = ADDRESS):
    """Stop the service; runs keep running, and a new `longhaul queue start` takes them back."""
    import ray

    handle = service(address)
    call(handle.shutdown)
    ray.kill(handle)
    print("queue service stopped; its runs go on")


@queue_app.command("status")
def status(address: str = ADDRESS, json_out: bool = typer.Option(False, "--json", help="print one JSON object")):
    """The runs on the books, the nodes, and the service's counters."""
    state = call(service(address).status)
    if json_out:
        print(json.dumps(state))
        return
    print(f"{'run':<7} {'domain':<12} {'prio':>4} {'state':<10} {'node':<12} {'tries':>5} {'pre-empted':>10}  reason")
    for r in state["runs"]:
        print(f"{r['id']:<7} {r['domain'][:12]:<12} {r['priority']:>4} {r['state']:<10} {r['node'][:12]:<12} {r['attempts']:>5} "
              f"{r['preemptions']:>10}  {r['reason']}")
    c = state["counts"]
    print(f"{len(state['nodes'])} nodes; {c['passes']} passes, {c['starts']} starts, {c['preemptions']} pre-emptions, "
          f"{c['nodes_lost']} runs lost with their node" + (f"; last pass failed: {state['error']}" if state["error"] else ""))


@queue_app.command("cancel")
def cancel(run_id: str = typer.Argument(..., help="the run's id (`longhaul queue status`)"), address: str = ADDRESS):
    """Cancel a queued or running run (a running one is stopped: it saves first)."""
    rec = call(service(address).cancel, run_id)
    print(f"run {rec['id']} will be cancelled at the next pass")


def submit(config: str = typer.Argument(..., help="the run's YAML (as for `longhaul train`)"),
           overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. train.steps=100"),
           priority: int = typer.Option(0, "--priority", help="higher pre-empts lower"),
           domain: str = typer.Option("default", "--domain", help="the queue it waits in; domains share the cluster fairly"),
           cpus: float = typer.Option(1.0, "--cpus"), mem_gb: float = typer.Option(0.0, "--mem-gb"),
           gpus: int = typer.Option(0, "--gpus"), address: str = ADDRESS):
    """Queue a training run (`longhaul train CONFIG`) for the cluster's queue service."""
    from longhaul.config import load_config
    from longhaul.jobqueue.units import run_units

    cfg = load_config(config, overrides or [])  # refuse a bad config here, not on a node later
    if cpus <= 0 or mem_gb < 0 or gpus < 0:
        raise LonghaulError("--cpus must be > 0, --mem-gb and --gpus >= 0")
    if not domain.replace("-", "").replace("_", "").isalnum():
        raise LonghaulError(f"--domain {domain!r}: use letters, digits, - and _")
    rec = {"domain": domain, "priority": priority, "config": Path(config).read_text(), "overrides": list(overrides or []),
           "workdir": os.getcwd(), "cpus": cpus, "mem_gb": mem_gb, "gpus": gpus, "units": run_units(cfg, cpus, mem_gb, gpus)}
    out = call(service(address).submit, rec)
    print(f"submitted {out['id']} (domain {domain}, priority {priority})")
