"""Structured logs: one JSON object a line, each HTTP request with its request id.

Owns the JSON formatter, `configure_logging` (the server's loggers and uvicorn's, to stderr)
and `RequestIdMiddleware`, a plain ASGI middleware (Starlette's BaseHTTPMiddleware would buffer
and slow streamed responses) that takes the client's `x-request-id` or makes one, returns it in
the response headers, stores it in `scope["state"]["request_id"]` for the handlers, and logs
one access line per request: method, path, status, seconds, and what the handler added
(`scope["state"]["log"]`: key name, tokens). Counts responses in the metrics too.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid

log = logging.getLogger("longhaul.serve")
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("longhaul.serve", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level.upper())
        lg.propagate = False
    logging.getLogger("uvicorn.access").disabled = True  # the middleware logs requests, with their ids


class RequestIdMiddleware:
    def __init__(self, app, metrics=None):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = None
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:128]
        rid = rid or f"req-{uuid.uuid4().hex}"
        state = scope.setdefault("state", {})
        state["request_id"], state["log"] = rid, {}
        t0, status = time.perf_counter(), [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope.get("path", "")
            if self.metrics is not None:
                route = scope.get("route")
                self.metrics.count_http(getattr(route, "path", None) or "other", status[0])
            if path not in ("/metrics", "/health", "/ready"):  # probes and scrapes would drown the log
                log.info("request", extra={"request_id": rid, "method": scope.get("method"), "path": path,
                                           "status": status[0], "seconds": round(time.perf_counter() - t0, 4),
                                           **state.get("log", {})})
