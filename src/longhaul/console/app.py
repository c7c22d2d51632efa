"""The console's web app: the JSON API over `Runs` and `Episodes`, the static pages, the token
check, and `run_console` under uvicorn.

API (every route under /api; with a token set, each needs `Authorization: Bearer TOKEN`):
- `GET /api/runs`: every run's summary;
- `GET /api/runs/{run}/summary`, `/config`, `/eval`;
- `GET /api/runs/{run}/metrics?after=N[&format=columns]`: only the metrics lines after line N, as
  rows or as one column per metric (what the run page's charts take);
- `GET /api/runs/{run}/episodes?source=FILE&result=pass|fail&task=ID&step=S&offset=&limit=&turns=`;
- `GET /api/runs/{run}/episode?source=FILE&id=LINE.MEMBER`: one episode, every turn whole;
- `GET /api/runs/{run}/audit?sandbox=ID`: the sandbox audit log's rows of one episode (its
  `info.sandbox`): every command it and its checks ran;
- `GET /api/environments`: the envcheck manifest's families, each marked current or stale;
- `GET /api/playground`: the OpenAI-compatible server given by `--serve` and its models;
- `POST /api/playground/chat`: a chat completion streamed from that server (`playground`).
Errors are `{"error": "<one line with the fix>"}` with their status: 400 for a name that is not
a path inside the runs directory, 404 for a run or file that is not (or no longer) there, 422
for an envcheck manifest that cannot be read, 502 when the playground's server does not answer,
503 when none is configured.

Pages (`/`, `/run?name=`, `/episode?run=&source=&id=`, `/environments`, `/playground`) are static files that call the API; a
token given as `?token=` is kept in the tab's sessionStorage and sent as that header. The pages
themselves hold no run data, so they need no token.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from longhaul.console.audit import Audits
from longhaul.console.environments import Environments
from longhaul.console.episodes import Episodes
from longhaul.console.paths import ConsoleError, RunsRoot
from longhaul.console.playground import Playground
from longhaul.console.runs import Runs
from longhaul.console.vendor import UPLOT
from longhaul.errors import LonghaulError

STATIC = Path(__file__).parent / "static"
TOKEN_ENV = "LONGHAUL_CONSOLE_TOKEN"
PAGES = {"/": "index.html", "/run": "run.html", "/episode": "episode.html", "/environments": "environments.html",
         "/playground": "playground.html"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(runs_dir: Path, token: str | None = None, manifest: Path | None = None, serve: str | None = None,
               serve_key: str | None = None) -> FastAPI:
    """The app over `runs_dir`; `manifest`: the envcheck manifest the environments page shows
    (default: the one training reads, `eval.envcheck.manifest_path`); `serve`: the base URL of
    the OpenAI-compatible server the playground chats through (with `serve_key`, its API key)."""
    root = RunsRoot(runs_dir)
    runs = Runs(root)
    episodes = Episodes(root, runs.cache)
    audits = Audits(root)
    environments = Environments(manifest)
    playground = Playground(serve, serve_key)

    def authorize(authorization: str | None = Header(None)) -> None:
        if not token:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ConsoleError(401, "this console needs its token: open the URL `longhaul console` printed (it ends in "
                                    "?token=...) or send 'Authorization: Bearer TOKEN'")

    app = FastAPI(title="longhaul console", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ConsoleError)
    async def _console_error(request: Request, exc: ConsoleError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())[1:]) or "the request"
        return JSONResponse({"error": f"{where}: {err.get('msg')}; fix the query"}, status_code=400)

    @app.exception_handler(FileNotFoundError)
    async def _gone(request: Request, exc: FileNotFoundError):  # a run deleted while a request read it
        return JSONResponse({"error": f"{Path(exc.filename or '?').name} disappeared while it was read (the run was deleted?); "
                                      "go back to the runs list"}, status_code=404)

    api = [Depends(authorize)]

    @app.get("/api/runs", dependencies=api)
    def list_runs():
        return {"runs": runs.summaries(), "root": str(root.root)}

    @app.get("/api/runs/{run:path}/summary", dependencies=api)
    def summary(run: str):
        return runs.summary(run)

    @app.get("/api/runs/{run:path}/config", dependencies=api)
    def config(run: str):
        return runs.config(run)

    @app.get("/api/runs/{run:path}/metrics", dependencies=api)
    def metrics(run: str, after: int = Query(0, ge=0), limit: int = Query(5000, ge=1, le=50000),
                format: str = Query("rows", pattern="^(rows|columns)$")):
        # plain JSON values already: serialised as they are, without FastAPI's walk over every
        # value (most of the time of a page of thousands of rows)
        read = runs.metric_columns if format == "columns" else runs.metrics
        return JSONResponse(read(run, after, limit))

    @app.get("/api/runs/{run:path}/eval", dependencies=api)
    def evaluation(run: str):
        return runs.evaluation(run)

    @app.get("/api/runs/{run:path}/episodes", dependencies=api)
    def episode_page(run: str, source: str, result: str | None = None, task: str | None = None, step: int | None = None,
                     offset: int = Query(0, ge=0), limit: int = Query(20, ge=1), turns: bool = True):
        return episodes.page(run, source, result, task, step, offset, limit, turns)

    @app.get("/api/runs/{run:path}/episode", dependencies=api)
    def episode(run: str, source: str, id: str):
        return episodes.one(run, source, id)

    @app.get("/api/runs/{run:path}/audit", dependencies=api)
    def audit(run: str, sandbox: str):
        return audits.episode(run, sandbox)

    @app.get("/api/environments", dependencies=api)
    def environment_list():
        return environments.listing()

    @app.get("/api/playground", dependencies=api)
    async def playground_models():
        return await playground.models()

    @app.post("/api/playground/chat", dependencies=api)
    async def playground_chat(request: Request):
        try:
            body = await request.json()
        except ValueError as e:
            raise ConsoleError(400, "the chat request is not JSON; send {model, messages}") from e
        return StreamingResponse(await playground.chat(body), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @app.get("/api/{rest:path}", dependencies=api)
    def unknown(rest: str):
        raise ConsoleError(404, f"no API route /api/{rest}; see the routes in docs/console.md")

    for route, page in PAGES.items():
        app.add_api_route(route, _page(page), methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _page(name: str):
    def page():  # no parameters: nothing from the request reaches the file name
        return FileResponse(STATIC / name, headers={"Cache-Control": "no-store"})
    return page


def run_console(runs_dir: Path, host: str = "127.0.0.1", port: int = 7860, token: str | None = None,
                serve: str | None = None, serve_key: str | None = None) -> None:
    """Serve the console until Ctrl-C. Off loopback a token is required (`--token` or LONGHAUL_CONSOLE_TOKEN)."""
    import uvicorn

    token = token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(host) and not token:
        raise LonghaulError(f"--host {host} is reachable from the network: pass --token SECRET (or set {TOKEN_ENV}) "
                            "so the API answers only holders of it")
    app = create_app(runs_dir, token, serve=serve, serve_key=serve_key)
    if not UPLOT.is_file():
        print("note: uPlot is not vendored, so the run page draws no charts; run `make console`")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    print(f"longhaul console over {Path(runs_dir).resolve()}: http://{shown}:{port}/" + (f"?token={token}" if token else ""))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
