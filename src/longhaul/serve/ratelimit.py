"""Per-key rate limits on requests and tokens per minute: token buckets, 429s and headers.

Owns `RateLimiter`: each limited key has a requests bucket and a tokens bucket, each holding
at most a minute's quota and refilling continuously (a minute's quota over 60 s). A request
takes one request and its prompt tokens when it is admitted; generated tokens are charged
as they are produced, so a bucket may go below zero and the key waits until it refills (what
the key used is what it pays, whatever `max_tokens` said). A request that would overdraw
gets 429 with `Retry-After` (whole seconds until enough has refilled) and OpenAI's
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers, which also go on every
allowed response. Does not own who a key is (`auth`) or the server-wide queue (`admission`).
"""

from __future__ import annotations

import math
import threading
import time

from longhaul.serve.auth import ApiKey
from longhaul.serve.openai_api.protocol import APIError


class Bucket:
    def __init__(self, per_minute: int, now: float):
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # refill per second
        self.level, self.t = self.capacity, now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
        self.t = now

    def seconds_until(self, amount: float) -> float:
        return max(0.0, (amount - self.level) / self.rate)


def _duration(s: float) -> str:
    """OpenAI's reset format: '850ms', '12s', '1m30s'."""
    if s < 1:
        return f"{int(s * 1000)}ms"
    if s < 60:
        return f"{s:.0f}s"
    return f"{int(s // 60)}m{s % 60:.0f}s"


class RateLimiter:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self._lock = threading.Lock()  # admitted in the event loop, charged from the engine thread

    def _bucket(self, key: ApiKey, kind: str, now: float) -> Bucket | None:
        limit = key.requests_per_minute if kind == "requests" else key.tokens_per_minute
        if limit is None:
            return None
        b = self._buckets.get((key.sha256, kind))
        if b is None:
            b = self._buckets[(key.sha256, kind)] = Bucket(limit, now)
        b.refill(now)
        return b

    def admit(self, key: ApiKey, prompt_tokens: int) -> dict[str, str]:
        """Take one request and the prompt's tokens, or raise a 429 APIError. Returns the headers."""
        if not key.limited:
            return {}
        with self._lock:
            now = self.clock()
            req, tok = self._bucket(key, "requests", now), self._bucket(key, "tokens", now)
            need_tokens = min(prompt_tokens, tok.capacity) if tok else 0
            short = []
            if req and req.level < 1:
                short.append(("requests", req.seconds_until(1)))
            if tok and tok.level < need_tokens:
                short.append(("tokens", tok.seconds_until(need_tokens)))
            if short:
                kind, wait = max(short, key=lambda x: x[1])
                limit = key.requests_per_minute if kind == "requests" else key.tokens_per_minute
                headers = {**self._headers(key, now), "Retry-After": str(max(1, math.ceil(wait)))}
                raise APIError(429, f"Rate limit reached for {kind} per minute on key {key.name!r} (limit {limit}); "
                                    f"retry in {wait:.1f} s", type=kind, code="rate_limit_exceeded", headers=headers)
            if req:
                req.level -= 1
            if tok:
                tok.level -= prompt_tokens
            return self._headers(key, now)

    def charge(self, key: ApiKey, tokens: int) -> None:
        """Charge generated tokens (called as they are produced)."""
        if key.tokens_per_minute is None or tokens <= 0:
            return
        with self._lock:
            b = self._bucket(key, "tokens", self.clock())
            b.level -= tokens

    def _headers(self, key: ApiKey, now: float) -> dict[str, str]:
        out = {}
        for kind in ("requests", "tokens"):
            b = self._bucket(key, kind, now)
            if b is None:
                continue
            out[f"x-ratelimit-limit-{kind}"] = str(int(b.capacity))
            out[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(b.level)))
            out[f"x-ratelimit-reset-{kind}"] = _duration(b.seconds_until(b.capacity))
        return out
