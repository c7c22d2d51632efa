"""Serving: an OpenAI-compatible HTTP API over the inference engine, with API keys, per-key
rate limits, a bounded admission queue, asynchronous agent jobs, Prometheus metrics and JSON
logs (`longhaul serve`; docs/serving.md).

Layout: `app` (state, FastAPI app, health/ready/metrics, `serve`), `engine_process` (the
engine in a process of its own: the server's side) and `engine_core` (the engine's side),
`openai_api/` (wire protocol, chat rendering and tool calls,
logprobs, routes), `auth`, `ratelimit`, `admission`, `metrics`, `logs`, `weights`
(manifest-verified safetensors, mmap, fsspec URLs), `jobs/` (stores, runner, routes).
FastAPI, uvicorn and prometheus-client are the `serve` extra; they are imported by these
modules only, so `import longhaul` does not need them. The thread that steps an engine in this
process and the streams its outputs go to are `longhaul.inference.engine_loop` (rollouts use it too).
"""

from longhaul.serve.config import ServeConfig


def serve(config: ServeConfig) -> None:
    from longhaul.serve.app import serve as run

    run(config)


__all__ = ["ServeConfig", "serve"]
