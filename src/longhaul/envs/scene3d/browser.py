"""One warm headless Chromium for the scene3d verifier, driven by Playwright from its own thread.

Playwright's sync API belongs to the thread that started it, while episodes verify from many
threads; so a `BrowserPool` owns one thread, one Playwright and one browser, and runs jobs
`fn(context)` one at a time, each in a fresh browser context (no state leaks between checks).
Every context blocks the network: only requests to the page's own fake origin are answered (from
the project folder), everything else is aborted.

A job that outlives its timeout does not hang the caller: the browser and its Playwright are
dropped (the Chromium processes, marked by a per-launch token, are killed by pid) and the next
job starts a fresh one. WebGL runs on SwiftShader, so no GPU is needed.

It does not know what is checked (see `verify`).
"""

from __future__ import annotations

import atexit
import mimetypes
import os
import queue
import shutil
import signal
import threading
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from longhaul.errors import LonghaulError

ORIGIN = "http://scene3d.local/"  # a name no resolver answers: requests to it are fulfilled from disk
ARGS = ("--use-angle=swiftshader", "--use-gl=angle", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist",
        "--no-sandbox", "--disable-dev-shm-usage", "--mute-audio")
QUEUE_LIMIT_S = 600.0  # longest wait for the jobs queued before one (each has its own timeout)
STOP_S = 10.0  # how long drop() waits for the browser to close cleanly


def chromium_path() -> str:
    """Debian's Chromium binary (the wrapper script's target when present), or a one-line fix."""
    for cand in (os.environ.get("LONGHAUL_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise LonghaulError("no chromium executable; run `make scene3d` (apt-get install chromium) or set LONGHAUL_CHROMIUM")


class BrowserPool:
    def __init__(self):
        self._jobs: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._token = ""
        self._lock = threading.Lock()

    # ---- public -----------------------------------------------------------------------
    def run(self, fn, project: Path, timeout_s: float):
        """`fn(context)` in a fresh network-blocked context serving `project` at ORIGIN; raises
        TimeoutError (after dropping the browser) when it takes longer than `timeout_s`."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._start()
            jobs = self._jobs
        fut: Future = Future()
        started = threading.Event()  # the timeout counts from the job's start, not its wait in the queue
        jobs.put((fn, Path(project), fut, started))
        try:
            started.wait(QUEUE_LIMIT_S)
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            self.drop(force=True)
            raise TimeoutError(f"the browser check ran past {timeout_s:g} s") from None

    def drop(self, force: bool = False) -> None:
        """Stop the browser (at once with `force`: its processes by pid); the next `run` launches a fresh one."""
        with self._lock:
            thread, token = self._thread, self._token
            if self._jobs is not None:
                self._jobs.put(None)
            self._jobs, self._thread = None, None
        if force:
            _kill_marked(token)
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0 if force else STOP_S)  # a clean stop before the interpreter exits (a daemon thread torn down mid-call crashes it)
        _kill_marked(token)

    close = drop

    # ---- the browser's thread -----------------------------------------------------------
    def _start(self) -> None:
        self._token = f"--longhaul-scene3d={uuid.uuid4().hex}"  # Chromium ignores unknown switches
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(self._jobs, self._token), daemon=True, name="scene3d-browser")
        self._thread.start()

    @staticmethod
    def _serve(jobs: queue.Queue, token: str) -> None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            sync_playwright = None

        pw = browser = None
        try:
            while (job := jobs.get()) is not None:
                fn, project, fut, started = job
                started.set()
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if sync_playwright is None:
                        raise LonghaulError("playwright is not installed; pip install -e '.[scene3d]' (or make setup)")
                    if browser is None or not browser.is_connected():
                        pw = pw or sync_playwright().start()
                        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=[*ARGS, token])
                    ctx = browser.new_context(viewport={"width": 640, "height": 480})
                    try:
                        ctx.route("**/*", lambda route: _answer(route, project))
                        fut.set_result(fn(ctx))
                    finally:
                        ctx.close()
                except BaseException as e:  # the caller decides; the thread keeps serving
                    if not fut.done():
                        fut.set_exception(e)
        finally:
            for stop in (lambda: browser and browser.close(), lambda: pw and pw.stop()):
                try:
                    stop()
                except Exception:
                    pass


def _answer(route, project: Path) -> None:
    """Serve ORIGIN from `project`; abort every other request (no network)."""
    url = route.request.url
    if not url.startswith(ORIGIN):
        route.abort("blockedbyclient")
        return
    rel = url[len(ORIGIN):].split("?", 1)[0].split("#", 1)[0] or "index.html"
    path = (project / rel).resolve()
    if project.resolve() not in path.parents or not path.is_file():
        route.fulfill(status=404, body="not found")
        return
    route.fulfill(status=200, body=path.read_bytes(), content_type=mimetypes.guess_type(path.name)[0] or "application/octet-stream")


def _kill_marked(token: str) -> None:
    """Kill (by pid) the processes whose command line holds this pool's launch token."""
    if not token:
        return
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if token.encode() in (d / "cmdline").read_bytes():
                os.kill(int(d.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


_shared: BrowserPool | None = None


def shared_pool() -> BrowserPool:
    """The process's one browser pool, stopped at exit."""
    global _shared
    if _shared is None:
        _shared = BrowserPool()
        atexit.register(_shared.drop)  # at exit, before the interpreter tears the thread down
    return _shared
