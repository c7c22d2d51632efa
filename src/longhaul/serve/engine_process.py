"""The server's engine in a process of its own (the default of `longhaul serve`), so that HTTP,
tokenization and streaming never take the GIL or the cores from a step in flight.

Owns `EngineProcess`, the server's side: it spawns the engine process (`engine_core.run`),
sends it submits and aborts, and a receiver thread turns each step's one message into outputs
for the requests' streams, as `EngineLoop` does in-process, behind the same interface (start,
stop, submit, abort, num_pending, num_active, engine, steps, error). And `EngineView`, what the
server reads of that engine: sizes from its ready message, gauges from its latest message,
rare calls (pause, resume, update_weights) as a request and its reply. The engine's side and
the wire format live in `engine_core`. Does not restart a dead engine: it fails the requests in
flight with the reason, refuses new ones with it, and the server reports it on /health.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from typing import Callable

from longhaul.errors import LonghaulError
from longhaul.inference.engine_loop import deliver
from longhaul.inference.outputs import RequestMetrics, RequestOutput
from longhaul.serve import engine_core

log = logging.getLogger("longhaul.serve")


class _Request:
    """The server's copy of one request's cumulative output, rebuilt from the engine's deltas."""

    __slots__ = ("request_id", "stream", "prompt_ids", "token_ids", "logprobs", "top", "versions", "text")

    def __init__(self, request_id: str, stream, prompt_ids: list[int]):
        self.request_id, self.stream, self.prompt_ids = request_id, stream, prompt_ids
        self.token_ids, self.logprobs, self.versions, self.top, self.text = [], [], [], None, ""

    def apply(self, delta) -> RequestOutput:
        _, ts, ids, lps, top, versions, cs, tail, reason, metrics = delta
        self.token_ids = self.token_ids[:ts] + ids  # new lists: an output handed out before never changes
        self.logprobs = self.logprobs[:ts] + lps
        self.versions = self.versions[:ts] + versions
        if top is not None:
            self.top = (self.top or [])[:ts] + top
        self.text = self.text[:cs] + tail
        return RequestOutput(self.request_id, None, self.prompt_ids, self.token_ids, self.text, self.logprobs, self.top,
                             self.versions, reason, reason is not None, RequestMetrics(*metrics) if metrics else None)


class _Blocks:
    """The KV pool's size, for the server's up-front fit check (`BlockManager.blocks_for`'s rounding)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


class _SpecView:
    def __init__(self, view: "EngineView"):
        self._view = view

    def stats(self) -> dict:
        return dict(self._view._spec_stats)


class EngineView:
    """The parts of `LLMEngine` the server reads, for an engine in the engine process."""

    def __init__(self, proc: "EngineProcess", info: dict):
        self._proc = proc
        self.pid = info["pid"]
        self.max_model_len, self.vocab_size = info["max_model_len"], info["vocab_size"]
        self.block_manager = _Blocks(info["num_blocks"], info["block_size"])
        self._keys, self._spec_keys = info["stats_keys"], info["spec_keys"]
        self.spec = _SpecView(self) if self._spec_keys is not None else None
        self._paused = False
        self._update(info["stats"])

    def _update(self, stats) -> None:
        values, spec = stats
        self._stats = dict(zip(self._keys, values))  # replaced whole: readers in other threads see one step's figures
        self._spec_stats = dict(zip(self._spec_keys, spec)) if spec is not None else {}

    def stats(self) -> dict:
        """`LLMEngine.stats()` as of the engine's latest message."""
        return dict(self._stats)

    def has_unfinished_requests(self) -> bool:
        return self._stats["num_requests_running"] + self._stats["num_requests_waiting"] > 0

    @property
    def weight_version(self) -> int:
        return self._stats["weight_version"]

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Returns once the engine has stopped stepping (as `LLMEngine.pause`)."""
        self._proc.call("pause")
        self._paused = True

    def resume(self) -> None:
        self._proc.call("resume")
        self._paused = False

    def update_weights(self, weights, version: int, keep_kv: bool = False) -> int:
        return self._proc.call("update_weights", weights, version, keep_kv)

    def flush_prefix_cache(self) -> None:
        self._proc.call("flush_prefix_cache")


def _exit_status(proc) -> str:
    proc.join(5)
    code = proc.exitcode
    if code is None:
        return "no exit status yet"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class EngineProcess:
    """`EngineLoop`'s interface over an engine in a spawned process. `observer(stream, output,
    now)` runs in the receiver thread for every output (metrics); it must be cheap and must not
    raise."""

    def __init__(self, config, observer: Callable | None = None):
        self.config, self.observer = config, observer
        self.engine: EngineView | None = None
        self.tokenizer = None
        self.error: str | None = None  # why the engine can no longer serve (it died); None while it can
        self.steps = 0  # engine steps, as the engine counts them
        self.messages = 0  # step messages received: one a step, plus one after commands no step follows
        self.message_bytes = self.max_message_bytes = 0  # pickled sizes of the step messages
        self._reqs: dict[int, _Request] = {}  # handle -> request, from submit until its last output
        self._handles: dict[str, int] = {}  # request id -> handle
        self._calls: dict[int, list] = {}  # call id -> [done event, result, error]
        self._ids = itertools.count()
        self._added_sent = self._added_applied = 0
        self._refusal: str | None = None  # set once no new request can be served
        self._lock = threading.Lock()  # the dicts above: the event loop and job workers submit, the receiver dispatches
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self._proc = self._thread = self._commands = self._outputs = None

    # ---- any thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the engine process and wait until its engine is built (minutes for a big model);
        raises the error that stopped it (one line) when it could not be. Idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="longhaul-engine-receiver", daemon=True)
            self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine after its step in flight and wait for the process to exit (killing it
        after `timeout`); requests still running fail with "the server is shutting down"."""
        self._stopping = True
        with self._lock:
            self._refusal = self._refusal or "the server is shutting down"
        self._send(("stop",))
        if self._thread is not None:
            self._thread.join(timeout)
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        if self.messages:
            log.info("engine process stopped", extra={"steps": self.steps, "step_messages": self.messages,
                                                      "mean_message_bytes": round(self.message_bytes / self.messages),
                                                      "max_message_bytes": self.max_message_bytes})

    def submit(self, request_id: str, prompt_ids: list[int], params, stream) -> None:
        """Send a request to the engine; never waits for a step. Errors the engine raises on
        adding it (e.g. too long) arrive through the stream."""
        ids = list(prompt_ids)
        with self._lock:  # sent under the lock: a request's add and abort reach the engine in the order they were made
            refusal = self._refusal
            if refusal is None:
                h = next(self._ids)
                self._reqs[h] = _Request(request_id, stream, ids)
                self._handles.setdefault(request_id, h)  # a duplicate id is refused by the engine; abort reaches the first
                self._added_sent += 1
                self._send(("add", h, request_id, ids, params))
        if refusal is not None:
            deliver([(stream, None, RuntimeError(refusal))])

    def abort(self, request_id: str) -> None:
        with self._lock:
            h = self._handles.get(request_id)
            if h is not None:
                self._send(("abort", h))

    @property
    def num_pending(self) -> int:
        """Requests sent but not yet handed to the engine (they join it before its next step)."""
        return max(0, self._added_sent - self._added_applied)

    @property
    def num_active(self) -> int:
        return len(self._reqs)

    def call(self, method: str, *args, timeout: float | None = 600):
        """Run `engine.<method>(*args)` in the engine process between two steps; its result."""
        done, slot = threading.Event(), None
        with self._lock:
            if self._refusal is not None:
                raise LonghaulError(f"the engine cannot take {method}(): {self._refusal}")
            call_id = next(self._ids)
            slot = self._calls[call_id] = [done, None, None]
        self._send(("call", call_id, method, args))
        if not done.wait(timeout):
            raise TimeoutError(f"the engine did not answer {method}() within {timeout} s")
        if slot[2] is not None:
            raise slot[2]
        return slot[1]

    def _send(self, msg) -> None:
        with self._send_lock:
            if self._commands is None:
                return
            try:
                self._commands.send(msg)
            except OSError:  # the process is gone: the receiver fails what was sent
                pass

    # ---- the receiver thread -------------------------------------------------------------
    def _run(self) -> None:
        """Spawn the engine, then dispatch its messages until it exits. The process is spawned
        from this thread because its parent-death signal follows the spawning thread."""
        ctx = multiprocessing.get_context("spawn")
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=engine_core.run, args=(self.config, cmd_r, out_w, os.getpid()), name="longhaul-engine",
                                 daemon=True)
        try:
            self._proc.start()
        except Exception as e:
            self._load_error = LonghaulError(f"the engine process did not start ({type(e).__name__}: {e})")
            self._ready.set()
            return
        finally:
            cmd_r.close()  # only the child holds these ends now: its exit reads as EOF here
            out_w.close()
        with self._send_lock:
            self._commands, self._outputs = cmd_w, out_r
        if self._handshake():
            self._receive()
        with self._send_lock:
            cmd_w.close()
            self._commands = None
        out_r.close()

    def _receive(self) -> None:
        while True:
            try:
                data = self._outputs.recv_bytes()
            except (EOFError, OSError):
                break
            msg = pickle.loads(data)
            if msg[0] == "step":
                self.messages += 1
                self.message_bytes += len(data)
                self.max_message_bytes = max(self.max_message_bytes, len(data))
                self._on_step(msg)
            elif msg[0] == "failed":
                self._on_failed(msg)
            elif msg[0] == "reply":
                self._on_reply(msg)
        status = _exit_status(self._proc)
        if self._stopping:
            self._fail_all("the server is shutting down")
        else:
            self.error = f"the engine process exited ({status}); the requests in flight failed; restart the server"
            log.error(self.error)
            self._fail_all(self.error)

    def _handshake(self) -> bool:
        try:
            msg = pickle.loads(self._outputs.recv_bytes())
        except (EOFError, OSError):
            msg = ("load_failed", LonghaulError(
                f"the engine process exited ({_exit_status(self._proc)}) while loading {self.config.model!r}; its error is above "
                "(a script that starts the server must keep its own code under `if __name__ == \"__main__\":`, as for any spawned process)"))
        if msg[0] == "load_failed":
            self._load_error, self._refusal = msg[1], f"the model failed to load: {msg[1]}"
            self._proc.join(10)
            self._ready.set()
            return False
        _, info, self.tokenizer = msg
        self.engine = EngineView(self, info)
        self._ready.set()
        return True

    def _on_step(self, msg) -> None:
        _, steps, t0, deltas, aborted, errors, scheduled, added, stats = msg
        now = time.perf_counter()
        self.steps, self._added_applied = steps, added
        self.engine._update(stats)
        items = []
        for h, err in errors:  # the engine refused to add these
            if (req := self._forget(h)) is not None:
                items.append((req.stream, None, err))
        for d in aborted:  # metrics count aborts (finish_reason "abort"); the stream's reader has gone
            if (req := self._forget(d[0])) is not None and self.observer is not None:
                self.observer(req.stream, req.apply(d), now)
        for h in scheduled:
            if (req := self._reqs.get(h)) is not None:
                req.stream.scheduled = t0
        for d in deltas:
            req = self._reqs.get(d[0])
            if req is None:
                continue
            out = req.apply(d)
            if out.finished:
                self._forget(d[0])
            stream = req.stream
            if self.observer is not None:
                self.observer(stream, out, now)
            stream.last_token_time, stream.num_tokens = now, len(out.token_ids)
            items.append((stream, out, None))
        deliver(items)

    def _on_failed(self, msg) -> None:
        _, handles, error, trace, added, stats = msg
        log.error("engine step failed: %s: %s", type(error).__name__, error, extra={"traceback": trace})
        self._added_applied = added
        self.engine._update(stats)
        deliver([(req.stream, None, error) for h in handles if (req := self._forget(h)) is not None])

    def _on_reply(self, msg) -> None:
        _, call_id, result, error, stats = msg
        self.engine._update(stats)  # e.g. the weight version after update_weights
        with self._lock:
            slot = self._calls.pop(call_id, None)
        if slot is not None:
            slot[1], slot[2] = result, error
            slot[0].set()

    def _forget(self, h: int) -> _Request | None:
        with self._lock:
            req = self._reqs.pop(h, None)
            if req is not None and self._handles.get(req.request_id) == h:
                del self._handles[req.request_id]
        return req

    def _fail_all(self, reason: str) -> None:
        error = RuntimeError(reason)
        with self._lock:
            self._refusal = self._refusal or reason
            items = [(req.stream, None, error) for req in self._reqs.values()]
            self._reqs.clear()
            self._handles.clear()
            calls = list(self._calls.values())
            self._calls.clear()
        deliver(items)
        for slot in calls:
            slot[2] = error
            slot[0].set()
