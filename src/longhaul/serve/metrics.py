"""Prometheus metrics of a server, under vLLM's names with a `longhaul:` prefix.

Owns the registry behind `/metrics`. Read from the engine at scrape time: gauges
`num_requests_running`, `num_requests_waiting` (the engine's waiting queue plus requests
accepted but not yet handed to it), `kv_cache_usage_perc`, `kv_offload_host_bytes`,
`kv_offload_disk_bytes`; counters `prefix_cache_queries`, `prefix_cache_hits` (tokens found in
the pool), `kv_offload_host_hits`, `kv_offload_disk_hits` (tokens each offload tier gave back: a
tier's hit rate is its hits over the queries), `kv_offload_stores` (blocks), `prompt_tokens`,
`generation_tokens`, `num_preemptions`, `spec_decode_num_draft_tokens`,
`spec_decode_num_accepted_tokens` (exposed with `_total`).
Observed per request in the engine loop (`observe`): histograms
`time_to_first_token_seconds`, `inter_token_latency_seconds` (between a request's outputs),
`e2e_request_latency_seconds`, `request_queue_time_seconds` (accepted -> first scheduled);
`request_success_total{finished_reason}` and per-key usage `api_key_tokens_total{key, kind}`
(key names, never secrets). `jobs{status}` counts agent jobs. Every series has `model_name`.
Timings start when the server accepts a request, so they include its HTTP-side queueing.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class _EngineCollector:
    """Gauges and counters read from the engine (and the loop in front of it) at scrape time."""

    def __init__(self, model_name: str, loop, job_counts: Callable[[], dict] | None):
        self.model_name, self.loop, self.job_counts = model_name, loop, job_counts

    def collect(self):
        eng = self.loop.engine
        s = eng.stats()
        spec = eng.spec.stats() if eng.spec is not None else {}
        gauges = {"num_requests_running": (s["num_requests_running"], "Requests in the running batch."),
                  "num_requests_waiting": (s["num_requests_waiting"] + self.loop.num_pending, "Requests waiting to be scheduled."),
                  "kv_cache_usage_perc": (s["kv_cache_usage_perc"], "KV-cache usage, 1 = full."),
                  "engine_threads": (s["engine_threads"], "Intra-op threads of the engine's last step."),
                  "kv_offload_host_bytes": (s["kv_offload_host_bytes"], "Bytes of KV blocks in the host-memory offload tier."),
                  "kv_offload_disk_bytes": (s["kv_offload_disk_bytes"], "Bytes of KV blocks this engine keeps on disk.")}
        for name, (value, doc) in gauges.items():
            g = GaugeMetricFamily(f"longhaul:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], float(value))
            yield g
        counters = {"prefix_cache_queries": (s["prefix_cache_queries"], "Prompt tokens looked up in the prefix cache."),
                    "prefix_cache_hits": (s["prefix_cache_hits"], "Prompt tokens found in the prefix cache."),
                    "prompt_tokens": (s["prompt_tokens_total"], "Prefilled prompt tokens."),
                    "generation_tokens": (s["generation_tokens_total"], "Generated tokens."),
                    "num_preemptions": (s["num_preemptions_total"], "Preemptions by recompute."),
                    "thread_switches": (s["thread_switches_total"], "Changes of the engine's intra-op thread count."),
                    "kv_offload_stores": (s["kv_offload_stores_total"], "KV blocks evicted from the pool into the offload tiers."),
                    "kv_offload_host_hits": (s["kv_offload_host_hits"], "Prompt tokens brought back from host memory."),
                    "kv_offload_disk_hits": (s["kv_offload_disk_hits"], "Prompt tokens brought back from disk."),
                    "spec_decode_num_draft_tokens": (spec.get("spec_decode_num_draft_tokens", 0), "Drafted tokens."),
                    "spec_decode_num_accepted_tokens": (spec.get("spec_decode_num_accepted_tokens", 0), "Accepted drafts.")}
        for name, (value, doc) in counters.items():
            c = CounterMetricFamily(f"longhaul:{name}", doc, labels=["model_name"])
            c.add_metric([self.model_name], float(value))
            yield c
        if self.job_counts is not None:
            g = GaugeMetricFamily("longhaul:jobs", "Agent jobs by status.", labels=["model_name", "status"])
            for status, n in self.job_counts().items():
                g.add_metric([self.model_name, status], float(n))
            yield g


class Metrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        m, r = ["model_name"], self.registry
        self.ttft = Histogram("longhaul:time_to_first_token_seconds", "Time to first token.", m, buckets=_LATENCY, registry=r)
        self.itl = Histogram("longhaul:inter_token_latency_seconds", "Time between a request's outputs.", m, buckets=_ITL, registry=r)
        self.e2e = Histogram("longhaul:e2e_request_latency_seconds", "Accepted to finished.", m, buckets=_LATENCY, registry=r)
        self.queue = Histogram("longhaul:request_queue_time_seconds", "Accepted to first scheduled.", m, buckets=_LATENCY, registry=r)
        self.success = Counter("longhaul:request_success", "Finished requests.", [*m, "finished_reason"], registry=r)
        self.key_tokens = Counter("longhaul:api_key_tokens", "Tokens by API key.", [*m, "key", "kind"], registry=r)
        self.http = Counter("longhaul:http_requests", "HTTP responses.", [*m, "path", "status"], registry=r)
        self._ttft, self._itl, self._e2e, self._queue = (h.labels(model_name) for h in (self.ttft, self.itl, self.e2e, self.queue))

    def watch(self, loop, job_counts: Callable[[], dict] | None = None) -> None:
        self.registry.register(_EngineCollector(self.model_name, loop, job_counts))

    def observe(self, stream, out, now: float) -> None:
        """Engine-loop observer: one call per output of a request."""
        name = stream.key.name if stream.key is not None else "anonymous"
        new = len(out.token_ids) - stream.num_tokens
        if stream.num_tokens == 0:
            self._ttft.observe(now - stream.arrival)
            self._queue.observe((stream.scheduled or now) - stream.arrival)
            self.key_tokens.labels(self.model_name, name, "prompt").inc(len(out.prompt_token_ids))
        elif stream.last_token_time is not None:
            self._itl.observe(now - stream.last_token_time)
        if new > 0:
            self.key_tokens.labels(self.model_name, name, "generation").inc(new)
        if out.finished:
            self._e2e.observe(now - stream.arrival)
            self.success.labels(self.model_name, out.finish_reason or "abort").inc()

    def count_http(self, path: str, status: int) -> None:
        self.http.labels(self.model_name, path, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
