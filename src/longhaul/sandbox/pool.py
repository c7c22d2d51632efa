"""`SandboxPool`: a bounded pool of warm sandboxes. `acquire` waits (async) for a free one;
`release` resets it to its clean snapshot (or replaces it if that fails) before reuse."""

from __future__ import annotations

import asyncio
import statistics
import time
from contextlib import asynccontextmanager

from longhaul.sandbox.sandbox import Sandbox
from longhaul.sandbox.spec import SandboxSpec


class SandboxPool:
    def __init__(self, size: int, spec: SandboxSpec | None = None, backend: str | None = None, audit=None):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self.size, self.spec, self.backend, self.audit = size, spec or SandboxSpec(), backend, audit
        self._free: list[tuple[Sandbox, str]] = []
        self._all: list[Sandbox] = []
        self._cond: asyncio.Condition | None = None
        self.waiting = 0
        self._latencies: list[float] = []
        self._closed = False

    def _new(self) -> tuple[Sandbox, str]:
        sb = Sandbox(self.spec, self.backend, self.audit)
        self._all.append(sb)
        return sb, sb.snapshot()

    async def acquire(self) -> Sandbox:
        if self._closed:
            raise RuntimeError("pool is closed")
        self._cond = self._cond or asyncio.Condition()
        async with self._cond:
            self.waiting += 1
            try:
                while not self._free and len(self._all) >= self.size:
                    await self._cond.wait()
            finally:
                self.waiting -= 1
            if self._free:
                sb, token = self._free.pop()
            else:
                sb, token = await asyncio.to_thread(self._new)
            sb._pool_token = token
            return sb

    async def release(self, sb: Sandbox) -> None:
        try:
            await asyncio.to_thread(self._reset, sb)
            entry = (sb, sb._pool_token)
        except Exception:  # a sandbox that cannot be reset is replaced, never reused dirty
            sb.close()
            self._all.remove(sb)
            entry = await asyncio.to_thread(self._new)
        async with self._cond:
            self._free.append(entry)
            self._cond.notify()

    def _reset(self, sb: Sandbox) -> None:
        if sb.cgroup:
            sb.cgroup.kill_all()
        sb.restore(sb._pool_token)

    @asynccontextmanager
    async def sandbox(self):
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await self.release(sb)

    async def exec(self, argv: list[str], **kw):
        """Acquire, run one command, release; records exec latency."""
        async with self.sandbox() as sb:
            t0 = time.perf_counter()
            res = await asyncio.to_thread(sb.exec, argv, **kw)
            self._latencies.append(time.perf_counter() - t0)
            return res

    def metrics(self) -> dict:
        lat = sorted(self._latencies)
        q = (lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]) if lat else (lambda f: 0.0)
        return {"size": self.size, "in_use": len(self._all) - len(self._free), "idle": len(self._free), "waiting": self.waiting,
                "execs": len(lat), "exec_latency_p50_s": q(0.5), "exec_latency_p99_s": q(0.99),
                "exec_latency_mean_s": statistics.fmean(lat) if lat else 0.0}

    def close(self) -> None:
        self._closed = True
        for sb in self._all:
            sb.close()
        self._all.clear()
        self._free.clear()
