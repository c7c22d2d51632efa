"""The server: its state, the FastAPI app, and `serve()` under uvicorn.

Owns `ServerState` (the model and engine, the engine loop, keys, rate limiter, admission,
metrics, the job store and runner) and its life: `load()` builds the engine (weights through
`weights.load_model`) in the engine process (`engine_process`, the default) or in this one
(`inference.engine_loop`, with `engine_process: false`) and starts its loop; `start()` runs in the
background at app start-up, runs a warm-up generation, then marks the server ready and starts
the job workers; shutdown stops the workers, then the loop (in-flight jobs go back to the
queue; the engine process exits). Routes owned here: `/health` (200 while the process serves
HTTP and its engine lives; 503 with the reason once the engine process has died), `/ready`
(200 only after the model loaded and the warm-up generation ran; 503 before, with the load
error if it failed, and after the engine died) and `/metrics`; none of them needs a key. The
OpenAI routes live in `openai_api.routes`, jobs in `jobs.routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.inference.engine_loop import EngineLoop, ThreadStream
from longhaul.inference.sampling import SamplingParams
from longhaul.models.loader import cache_home
from longhaul.serve.admission import Admission
from longhaul.serve.auth import load_keys
from longhaul.serve.config import ServeConfig
from longhaul.serve.engine_core import build_engine
from longhaul.serve.engine_process import EngineProcess
from longhaul.serve.jobs.redis_store import RedisJobStore
from longhaul.serve.jobs.routes import router as jobs_router
from longhaul.serve.jobs.runner import JobRunner
from longhaul.serve.jobs.store import SqliteJobStore
from longhaul.serve.logs import RequestIdMiddleware, configure_logging
from longhaul.serve.metrics import CONTENT_TYPE, Metrics
from longhaul.serve.openai_api.logprobs import TokenTexts
from longhaul.serve.openai_api.protocol import APIError
from longhaul.serve.openai_api.routes import router as openai_router
from longhaul.serve.ratelimit import RateLimiter

log = logging.getLogger("longhaul.serve")


def default_model_name(model: str) -> str:
    return Path(model.rstrip("/").split("://")[-1]).name or model


def open_job_store(config: ServeConfig):
    if config.queue.startswith(("redis://", "rediss://", "unix://")):
        return RedisJobStore(config.queue, config.job_lease_s)
    if config.queue != "sqlite":
        raise LonghaulError(f"--queue must be sqlite or redis://host:port/db, got {config.queue!r}")

    if config.jobs_db:
        return SqliteJobStore(config.jobs_db)

    return SqliteJobStore(cache_home() / "serve" / "jobs.sqlite")


class ServerState:
    def __init__(self, config: ServeConfig, replica: str | None = None):
        self.config = config
        self.model_name = config.served_model_name or default_model_name(config.model)
        self.model_ids = {self.model_name, config.model, *config.lora_modules}
        if clash := next((m for m in (self.model_name, config.model) if m in config.lora_modules), None):
            raise LonghaulError(f"--lora-modules names an adapter {clash!r}, the base model's id; give it another name")
        self.created = int(time.time())
        self.replica = replica or socket.gethostname()
        self.keys = load_keys(config.api_keys, config.api_keys_file, config.requests_per_minute, config.tokens_per_minute)
        self.limiter = RateLimiter()
        self.admission = Admission(config.max_num_seqs, config.max_queued_requests)
        self.metrics = Metrics(self.model_name)
        self.jobs = open_job_store(config)
        self.engine = self.tokenizer = self.texts = self.loop = self.runner = None
        self.ready = False
        self.load_error: str | None = None

    # ---- life ----------------------------------------------------------------------------
    def load(self) -> None:
        """Build the engine and start its loop (blocking: minutes for a big model). With
        `engine_process` the engine is built in its own process and `self.engine` is its view."""
        c = self.config
        if c.engine_process:
            self.loop = EngineProcess(c, observer=self._observe)
            self.loop.start()
            self.engine, tok = self.loop.engine, self.loop.tokenizer
        else:
            self.engine, tok = build_engine(c)
            self.loop = EngineLoop(self.engine, observer=self._observe)
            self.loop.start()
        self.tokenizer, self.texts = tok, TokenTexts(tok)

    def start(self) -> None:
        """Load (if needed), warm up, become ready, start job workers."""
        try:
            if self.engine is None:
                self.load()
            self.metrics.watch(self.loop, self.jobs.counts)
            warm = ThreadStream()
            ids = self.tokenizer.encode("Warm-up: say hello.")
            self.loop.submit("warmup", ids, SamplingParams(max_tokens=self.config.warmup_tokens, min_tokens=self.config.warmup_tokens,
                                                           temperature=0), warm)
            warm.wait(timeout=600)
            self.ready = True
            log.info("ready", extra={"model": self.model_name, "replica": self.replica})
            self.runner = JobRunner(self.jobs, self.loop, self.tokenizer, self.engine.max_model_len, self.config.job_workers,
                                    self.replica, self.config.job_lease_s)
            self.runner.start()
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            log.exception("start-up failed")

    def shutdown(self) -> None:
        self.ready = False
        if self.runner is not None:
            self.runner.stop()
        if self.loop is not None:
            self.loop.stop()
        if self.runner is not None:
            self.runner.join()
        self.jobs.close()

    # ---- used by the routes --------------------------------------------------------------
    @property
    def engine_error(self) -> str | None:
        """Why the engine can no longer serve (its process died), or None."""
        return self.loop.error if self.loop is not None else None

    def check_ready(self) -> None:
        if self.engine_error:
            raise APIError(503, f"the engine failed: {self.engine_error}", type="server_error", code="engine_failed")
        if not self.ready:
            why = f"the model failed to load: {self.load_error}" if self.load_error else "the model is loading"
            raise APIError(503, f"{why}; retry later", type="server_not_ready", code="not_ready", headers={"Retry-After": "5"})

    def model_card(self, model_id: str | None = None) -> dict:
        """The card of the base model, or of one of its LoRA adapters (`parent`: the base's id)."""
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "longhaul", "root": self.config.model}
        if model_id in self.config.lora_modules:
            card.update(id=model_id, root=self.config.lora_modules[model_id], parent=self.model_name)
        if self.engine is not None:
            card["max_model_len"] = self.engine.max_model_len
        return card

    def model_cards(self) -> list[dict]:
        return [self.model_card(), *(self.model_card(name) for name in self.config.lora_modules)]

    def lora_of(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` names, or None for the base model."""
        return model if model in self.config.lora_modules else None

    def _observe(self, stream, out, now: float) -> None:
        if stream.key is not None:  # the warm-up has no key
            self.limiter.charge(stream.key, len(out.token_ids) - stream.num_tokens)
        self.metrics.observe(stream, out, now)


def _add_error_handlers(app) -> None:
    """Every error leaves as OpenAI's body: ours (APIError), FastAPI's, unknown routes and the unexpected."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return JSONResponse(APIError(400, str(e.errors()[0].get("msg"))).body(), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        log.exception("unhandled error", extra={"request_id": request.scope.get("state", {}).get("request_id")})
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error").body(), status_code=500)

    @app.exception_handler(404)
    async def not_found(request: Request, e):
        return JSONResponse(APIError(404, f"no route {request.url.path}", code="not_found").body(), status_code=404)

    @app.exception_handler(405)
    async def bad_method(request: Request, e):
        return JSONResponse(APIError(405, f"{request.method} is not allowed on {request.url.path}").body(), status_code=405)


def create_app(config: ServeConfig, state: ServerState | None = None):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    state = state or ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=state.start, name="longhaul-start", daemon=True).start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.shutdown)

    app = FastAPI(title="longhaul", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.include_router(openai_router)
    app.include_router(jobs_router)

    _add_error_handlers(app)

    @app.get("/health")
    async def health():
        if state.engine_error:  # the engine process died: only a restart brings it back
            return JSONResponse({"status": "failed", "error": state.engine_error}, status_code=503)
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if state.engine_error:
            return JSONResponse({"status": "failed", "error": state.engine_error}, status_code=503, headers={"Retry-After": "5"})
        if state.ready:
            return {"status": "ready", "model": state.model_name}
        body = {"status": "failed" if state.load_error else "loading", "error": state.load_error}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    app.add_middleware(RequestIdMiddleware, metrics=state.metrics)
    return app


def serve(config: ServeConfig) -> None:
    """Load the model (errors are one line before anything listens), then serve until Ctrl-C."""
    import uvicorn

    state = ServerState(config)  # bad keys files and queue URLs fail here, before anything is configured
    configure_logging(config.log_level)
    state.load()
    app = create_app(config, state)
    uvicorn.run(app, host=config.host, port=config.port, log_config=None, access_log=False, timeout_graceful_shutdown=5)
