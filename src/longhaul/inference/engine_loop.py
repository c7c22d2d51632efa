"""The one thread that steps an engine, and the streams its outputs go to.

The server steps its engine here, and so do rollouts (`rollout_sampler.generate`, where agent
episodes on many threads ask for replies at once). Every step runs on the loop's thread: torch's
OpenMP workers belong to the thread that starts a parallel region, so steps taken by many threads
each wake their own workers, which then compete for the cores.

Owns the engine loop: requests are submitted and aborted from any thread (the HTTP event loop,
job workers, episodes) without blocking (a command deque the loop drains before each step), one thread
calls `LLMEngine.step()` while work is pending and sleeps otherwise, and each step's outputs
go to their requests' streams. An `AsyncStream` belongs to an asyncio loop: a step's outputs
for one loop are handed over in a single `call_soon_threadsafe`, and since outputs are
cumulative a consumer that falls behind reads only the latest (no queue grows). A
`ThreadStream` is for blocking callers (agent jobs). Does not own HTTP, tokenization or
metrics (an `observer` callback sees every output in the loop thread). `engine_process` runs
the same loop in a process of its own (the server's default) behind the same interface.

Why a loop thread and not `engine.generate()`: `generate` drives its own step loop and must not
share the engine with another stepper; serving needs requests to join and leave between steps.
With `idle_exit_s` the thread ends after that long with nothing to do (so an engine no one uses
is not kept alive by it) and the next `submit` starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Callable

from longhaul.inference.outputs import RequestOutput
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.sequence import Status

log = logging.getLogger("longhaul.serve")


class Stream:
    """A request's outputs as the engine produces them, plus the timings metrics need."""

    def __init__(self, key=None):
        self.key = key  # the request's `auth.ApiKey`, for per-key usage and quotas
        self.num_tokens = 0  # generated tokens the observer has seen
        self.arrival = time.perf_counter()  # when the server accepted the request
        self.scheduled: float | None = None  # the start of the step that first scheduled it
        self.last_token_time: float | None = None
        self.latest: RequestOutput | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or (self.latest is not None and self.latest.finished)

    def _set(self, out: RequestOutput | None, error: BaseException | None) -> None:
        if error is not None:
            self.error = error
        else:
            self.latest = out


class AsyncStream(Stream):
    """Read from an asyncio loop: `await stream.next()` returns the newest output."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key=None):
        super().__init__(key)
        self.loop = loop
        self._event = asyncio.Event()
        self._seen: RequestOutput | None = None

    def _deliver(self, out, error) -> None:  # runs in the event loop
        self._set(out, error)
        self._event.set()

    async def next(self) -> RequestOutput:
        """The newest output not yet returned; raises the engine's error if the request failed."""
        while self.latest is self._seen and self.error is None:
            self._event.clear()
            await self._event.wait()
        if self.error is not None:
            raise self.error
        self._seen = self.latest
        return self.latest


class ThreadStream(Stream):
    """Read from a plain thread: `wait()` blocks until the request is finished."""

    def __init__(self, key=None):
        super().__init__(key)
        self._cond = threading.Condition()

    def _deliver(self, out, error) -> None:
        with self._cond:
            self._set(out, error)
            if self.done:  # `wait` only returns once done: no wake-up per token
                self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> RequestOutput:
        with self._cond:
            if not self._cond.wait_for(lambda: self.done, timeout):
                raise TimeoutError(f"request not finished after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.latest


class EngineLoop:
    """Steps `engine` in a daemon thread. `observer(stream, output, now)` runs in that thread
    for every output (metrics); it must be cheap and must not raise."""

    def __init__(self, engine, observer: Callable | None = None, idle_exit_s: float | None = None):
        self.engine = engine
        self.observer = observer
        self.idle_exit_s = idle_exit_s  # the thread ends after this long with nothing to do; `submit` starts it again
        self._commands: deque = deque()
        self._wake = threading.Condition()
        self._streams: dict[str, Stream] = {}  # in the engine, or about to be
        self._unscheduled: dict[str, Stream] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.error: str | None = None  # set when the engine can no longer serve (never, in this thread)

    # ---- any thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="longhaul-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, stream: Stream) -> None:
        """Queue a request; never blocks on a step in flight. Errors the engine raises on
        adding it (e.g. too long) arrive through the stream."""
        with self._wake:
            self._commands.append(("add", request_id, prompt_ids, params, stream))
            if self.idle_exit_s is not None and self._thread is None:
                self.start()
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        with self._wake:
            self._commands.append(("abort", request_id))
            self._wake.notify()

    def settle(self, request_ids, timeout: float = 60.0) -> None:
        """Abort `request_ids` and return once none of them is queued or in the engine, so no
        step works on them any more (a caller leaving on an error does not leave the thread
        computing for it while the process exits)."""
        ids = set(request_ids)
        for rid in ids:
            self.abort(rid)
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self._wake:
                busy = ids.intersection(self._streams) or any(c[1] in ids for c in self._commands)
            if not busy:
                return
            time.sleep(0.01)

    @property
    def num_pending(self) -> int:
        """Requests submitted but not yet handed to the engine (they join it before the next step)."""
        return sum(1 for c in list(self._commands) if c[0] == "add")

    @property
    def num_active(self) -> int:
        return len(self._streams) + sum(1 for c in list(self._commands) if c[0] == "add")

    # ---- the loop thread -----------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        while True:
            with self._wake:
                idle_since = time.perf_counter()
                while not self._commands and not self._stopping and not (eng.has_unfinished_requests() and not eng.paused):
                    if self.idle_exit_s is not None and not self._streams and time.perf_counter() - idle_since >= self.idle_exit_s:
                        self._thread = None  # under the lock: a submit from now on starts a new thread
                        return
                    # resume() does not notify us: poll while paused
                    self._wake.wait(0.05 if eng.paused else self.idle_exit_s)
                commands = list(self._commands)
                self._commands.clear()
                if self._stopping:
                    break
            for cmd in commands:
                self._apply(cmd)
            if not eng.has_unfinished_requests() or eng.paused:
                continue
            t0 = time.perf_counter()
            try:
                outs = eng.step()
            except Exception as e:  # a broken step fails its requests, not the server
                log.exception("engine step failed")
                self._fail_all(e)
                continue
            self.steps += 1
            self._mark_scheduled(t0)
            self._dispatch(outs)
        self._fail_all(RuntimeError("the server is shutting down"))

    def _apply(self, cmd) -> None:
        if cmd[0] == "abort":
            stream = self._streams.pop(cmd[1], None)
            self._unscheduled.pop(cmd[1], None)
            out = self.engine.abort_request(cmd[1]) if stream is not None else None
            if out is not None and self.observer is not None:  # metrics count aborts (finish_reason "abort")
                self.observer(stream, out, time.perf_counter())
            return
        _, rid, prompt_ids, params, stream = cmd
        try:
            self.engine.add_request(rid, prompt_ids, params)
        except Exception as e:
            deliver([(stream, None, e)])
            return
        self._streams[rid] = stream
        self._unscheduled[rid] = stream

    def _mark_scheduled(self, t0: float) -> None:
        if not self._unscheduled:
            return
        reqs = self.engine.requests
        for rid in [r for r, s in self._unscheduled.items() if (q := reqs.get(r)) is None or q.status is not Status.WAITING]:
            self._unscheduled.pop(rid).scheduled = t0

    def _dispatch(self, outs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        items = []
        for out in outs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted between its step and now
                continue
            if out.finished:
                self._streams.pop(out.request_id, None)
            if self.observer is not None:
                self.observer(stream, out, now)
            stream.last_token_time, stream.num_tokens = now, len(out.token_ids)
            items.append((stream, out, None))
        deliver(items)

    def _fail_all(self, error: BaseException) -> None:
        items = [(s, None, error) for s in self._streams.values()]
        for rid in list(self._streams):
            self.engine.abort_request(rid)
        self._streams.clear()
        self._unscheduled.clear()
        items += [(c[4], None, error) for c in self._commands if c[0] == "add"]
        self._commands.clear()
        deliver(items)



def deliver(items) -> None:
    """Deliver (stream, output, error) triples: one call_soon_threadsafe per event loop."""
    by_loop: dict = {}
    for stream, out, err in items:
        if isinstance(stream, AsyncStream):
            by_loop.setdefault(stream.loop, []).append((stream, out, err))
        else:
            stream._deliver(out, err)
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver_all, batch)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass


def _deliver_all(batch) -> None:
    for stream, out, err in batch:
        stream._deliver(out, err)
