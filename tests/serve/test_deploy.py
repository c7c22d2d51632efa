"""The deployment files agree with the code: probes hit routes the app has, the container args
are options `longhaul serve` takes, the weights are mounted read-only, the autoscalers read a
metric the server exports, and the Dockerfiles copy paths that exist."""

import re
from pathlib import Path

import typer
import yaml

from longhaul.cli import app as cli_app
from longhaul.inference.kv_offload import KVOffload
from longhaul.serve.app import create_app
from longhaul.serve.config import ServeConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(name):
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def serve_options() -> set[str]:
    cmd = typer.main.get_command(cli_app).commands["serve"]
    return {opt for p in cmd.params for opt in p.opts}


def test_kustomization_lists_existing_files():
    for f in docs("kustomization.yaml")[0]["resources"]:
        assert (DEPLOY / "k8s" / f).is_file(), f


def test_deployment_probes_args_and_read_only_weights(tmp_path):
    (dep,) = docs("deployment.yaml")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    routes = {getattr(r, "path", None) for r in create_app(ServeConfig(jobs_db=str(tmp_path / "j.sqlite"))).routes}
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"], "/metrics"} <= routes
    flags = {a for a in c["args"] if a.startswith("--")}
    assert flags <= serve_options(), flags - serve_options()
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    model_dir = c["args"][c["args"].index("--model") + 1]
    assert mounts["weights"]["mountPath"] == model_dir and mounts["weights"]["readOnly"] is True
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["weights"]["persistentVolumeClaim"]["readOnly"] is True
    assert docs("weights-pvc.yaml")[0]["spec"]["accessModes"] == ["ReadOnlyMany"]
    queue = c["args"][c["args"].index("--queue") + 1]
    (redis_svc,) = [d for d in docs("redis.yaml") if d["kind"] == "Service"]
    assert queue == f"redis://{redis_svc['metadata']['name']}:{redis_svc['spec']['ports'][0]['port']}/0"


def test_autoscalers_use_the_exported_waiting_metric():
    from longhaul.serve.metrics import _EngineCollector

    class Loop:
        num_pending = 0

        class engine:
            spec = None

            @staticmethod
            def stats():
                return dict.fromkeys(["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
                                      "prefix_cache_hits", "prompt_tokens_total", "generation_tokens_total",
                                      "num_preemptions_total", "engine_threads", "thread_switches_total"], 0) | KVOffload.no_stats()

    exported = {m.name for m in _EngineCollector("smollm2", Loop(), None).collect()}
    (scaled,) = docs("keda-scaledobject.yaml")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert re.search(r"longhaul:num_requests_waiting\b", query) and "longhaul:num_requests_waiting" in exported
    assert scaled["spec"]["scaleTargetRef"]["name"] == docs("deployment.yaml")[0]["metadata"]["name"]
    hpa, adapter = docs("hpa.yaml")
    rule = yaml.safe_load(adapter["data"]["rules.yaml"])["rules"][0]
    assert rule["name"]["as"] == hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert rule["name"]["matches"] in exported


def test_dockerfiles_copy_what_exists_and_run_longhaul_serve():
    root = DEPLOY.parent
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (DEPLOY / name).read_text()
        for line in re.findall(r"^COPY (.+)$", text, re.M):
            for src in line.split()[:-1]:
                assert (root / src).exists(), (name, src)
        entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
        assert entry[:2] == ["longhaul", "serve"] and {a for a in entry if a.startswith("--")} <= serve_options()
        assert (DEPLOY / f"{name}.dockerignore").is_file()
