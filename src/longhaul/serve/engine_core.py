"""The engine's side of the server's engine process: build the `LLMEngine`, step it, and talk
to the server over two pipes.

Owns `build_engine` (a `ServeConfig` -> the engine and its tokenizer; the in-process loop uses
it too, so both modes load the same weights the same way, manifest checks included) and
`run`, the engine process's main. `engine_process.EngineProcess` is the server's side; this
module never touches streams, HTTP or metrics.

The wire (pickled tuples of ints, floats and short strings; one `Connection` each way):

    server -> engine   ("add", handle, request_id, prompt_ids, params) | ("abort", handle)
                       ("call", call_id, method, args) | ("stop",)
    engine -> server   ("ready", info, tokenizer) or ("load_failed", error), once; then
                       ("step", steps, t0, deltas, aborted, errors, scheduled, added, stats),
                       one per engine step (and one after a batch of commands no step follows,
                       so gauges and aborts are never stale), ("failed", handles, error, trace,
                       added, stats) when a step raised, ("reply", call_id, result, error, stats)

A handle is a small int the server gives each request, so steps carry no id strings. A
delta is what a request's output gained in the step: (handle, token_start, new_token_ids,
new_logprobs, new_top_logprobs | None, new_weight_versions, text_start, text_tail,
finish_reason, metrics | None): the server keeps a request's lists and text up to the starts
and appends the tails (text only grows, or is cut where a stop string began). `metrics`
(the `RequestMetrics` fields) comes with the final output only. `stats` is the values of
`LLMEngine.stats()` (and the speculative decoder's) in the order the ready message names.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import astuple

from longhaul.hardware import resolve_dtype
from longhaul.inference import LLMEngine
from longhaul.inference.sequence import Status
from longhaul.serve.weights import load_model

CALLS = frozenset({"pause", "resume", "update_weights", "flush_prefix_cache"})  # engine methods the server may call


def build_engine(config):
    """(LLMEngine, tokenizer) for a ServeConfig: weights through `weights.load_model`."""
    import torch

    c = config
    if c.torch_threads:
        torch.set_num_threads(c.torch_threads)
    model, tok = load_model(c.model)
    engine = LLMEngine(model=model, tokenizer=tok, dtype=resolve_dtype(c.dtype), device=c.device, max_num_seqs=c.max_num_seqs,
                       max_num_batched_tokens=c.max_num_batched_tokens, max_model_len=c.max_model_len,
                       kv_cache_memory_gb=c.kv_cache_memory_gb, seed=c.seed, speculative_config=c.speculative_config,
                       kv_offload_memory_gb=c.kv_offload_memory_gb, kv_offload_dir=c.kv_offload_dir,
                       kv_offload_disk_gb=c.kv_offload_disk_gb,
                       kv_offload_namespace=c.model)  # the weights' source: replicas of one model share blocks
    for name, path in c.lora_modules.items():
        engine.add_lora(name, path)
    return engine, tok


def portable(e: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the server dies, however it dies; exit now if it already has.
    (The kernel sends it when the parent *thread* that spawned us exits: the server spawns
    from the thread that reads our messages, which lives as long as we do.)"""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)


def run(config, commands, outputs, parent_pid: int) -> None:
    """The engine process's main: load, say ready (or why not), then serve until "stop"."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides when we stop
    try:
        engine, tok = build_engine(config)
        core = Core(engine, commands, outputs)
        outputs.send(("ready", core.info(), tok))
    except Exception as e:
        outputs.send(("load_failed", portable(e)))
        return
    core.serve()


class Core:
    """Steps one engine; a reader thread queues the server's commands, applied between steps."""

    def __init__(self, engine, commands, outputs):
        self.engine, self.out = engine, outputs
        self.stats_keys = list(engine.stats())
        self.spec_keys = list(engine.spec.stats()) if engine.spec is not None else None
        self._commands: deque = deque()
        self._wake = threading.Condition()
        self._reqs: dict[int, list] = {}  # handle -> [request_id, tokens sent, text chars sent]
        self._handles: dict[str, int] = {}  # request_id -> handle
        self._unscheduled: set[int] = set()
        self.steps = self.added = 0
        threading.Thread(target=self._read, args=(commands,), name="longhaul-engine-commands", daemon=True).start()

    def info(self) -> dict:
        eng = self.engine
        return {"max_model_len": eng.max_model_len, "vocab_size": eng.vocab_size, "num_blocks": eng.block_manager.num_blocks,
                "block_size": eng.block_manager.block_size, "stats_keys": self.stats_keys, "spec_keys": self.spec_keys,
                "stats": self._stats(), "pid": os.getpid()}

    def _read(self, conn) -> None:
        while True:
            try:
                cmd = conn.recv()
            except (EOFError, OSError):  # the server is gone
                cmd = ("stop",)
            with self._wake:
                self._commands.append(cmd)
                self._wake.notify()
            if cmd[0] == "stop":
                return

    def serve(self) -> None:
        eng = self.engine
        while True:
            with self._wake:
                while not self._commands and not (eng.has_unfinished_requests() and not eng.paused):
                    self._wake.wait()  # pause and resume arrive as commands: no polling
                commands = list(self._commands)
                self._commands.clear()
            aborted, errors = [], []
            for cmd in commands:
                if cmd[0] == "stop":
                    return
                self._apply(cmd, aborted, errors)
            deltas, scheduled, t0, failure = [], [], 0.0, None
            stepped = eng.has_unfinished_requests() and not eng.paused
            if stepped:
                t0 = time.perf_counter()  # CLOCK_MONOTONIC on Linux: the server's perf_counter reads the same clock
                try:
                    outs = eng.step()
                    self.steps += 1
                    scheduled = self._mark_scheduled()
                    deltas = [self._delta(o) for o in outs]
                except Exception as e:  # a broken step fails its requests, not the server
                    failure, trace, stepped = e, traceback.format_exc(), False
            if stepped or commands:
                self.out.send(("step", self.steps, t0, deltas, aborted, errors, scheduled, self.added, self._stats()))
            if failure is not None:
                self._fail_all(failure, trace)

    def _apply(self, cmd, aborted: list, errors: list) -> None:
        eng = self.engine
        if cmd[0] == "add":
            _, h, rid, prompt_ids, params = cmd
            self.added += 1
            try:
                eng.add_request(rid, prompt_ids, params)
            except Exception as e:
                errors.append((h, portable(e)))
                return
            self._reqs[h], self._handles[rid] = [rid, 0, 0], h
            self._unscheduled.add(h)
        elif cmd[0] == "abort":
            req = self._reqs.get(cmd[1])
            out = eng.abort_request(req[0]) if req is not None else None
            if out is not None:
                aborted.append(self._delta(out))
            self._forget(cmd[1])
        elif cmd[0] == "call":
            _, call_id, method, args = cmd
            try:
                if method not in CALLS:
                    raise ValueError(f"the engine process does not take {method!r}; it takes {', '.join(sorted(CALLS))}")
                result, error = getattr(eng, method)(*args), None
            except Exception as e:
                result, error = None, portable(e)
            self.out.send(("reply", call_id, result, error, self._stats()))

    def _mark_scheduled(self) -> list[int]:
        if not self._unscheduled:
            return []
        reqs = self.engine.requests
        done = [h for h in self._unscheduled if (q := reqs.get(self._reqs[h][0])) is None or q.status is not Status.WAITING]
        self._unscheduled.difference_update(done)
        return done

    def _delta(self, out) -> tuple:
        h = self._handles[out.request_id]
        req = self._reqs[h]
        ts, cs = min(req[1], len(out.token_ids)), min(req[2], len(out.text))
        req[1], req[2] = len(out.token_ids), len(out.text)
        top = out.top_logprobs[ts:] if out.top_logprobs is not None else None
        metrics = astuple(out.metrics) if out.finished and out.metrics is not None else None
        if out.finished:
            self._forget(h)
        return (h, ts, out.token_ids[ts:], out.logprobs[ts:], top, out.weight_version[ts:], cs, out.text[cs:], out.finish_reason, metrics)

    def _forget(self, h: int) -> None:
        req = self._reqs.pop(h, None)
        if req is not None:
            self._handles.pop(req[0], None)
        self._unscheduled.discard(h)

    def _fail_all(self, error: BaseException, trace: str) -> None:
        """Abort every request in the engine and those queued to join it; tell the server which."""
        handles = list(self._reqs)
        for req in list(self._reqs.values()):
            self.engine.abort_request(req[0])
        with self._wake:
            queued = [c for c in self._commands if c[0] == "add"]
            kept = [c for c in self._commands if c[0] != "add"]
            self._commands.clear()
            self._commands.extend(kept)
        self.added += len(queued)
        handles += [c[1] for c in queued]
        self._reqs.clear()
        self._handles.clear()
        self._unscheduled.clear()
        self.out.send(("failed", handles, portable(error), trace, self.added, self._stats()))

    def _stats(self) -> tuple:
        eng = self.engine
        spec = tuple(eng.spec.stats().values()) if eng.spec is not None else None
        return tuple(eng.stats().values()), spec
