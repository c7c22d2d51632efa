"""The bounded admission queue: how many generation requests the server holds at once.

Owns `Admission`: a request takes a slot per choice before it reaches the engine and gives
them back when it ends; with every slot taken the request gets 503 with `Retry-After` at
once, instead of waiting in an unbounded queue. Capacity is `max_num_seqs` (running) plus
`max_queued_requests` (waiting). `Retry-After` is an estimate: the mean request duration
seen recently times the number of queue "turns" ahead, at least 1 s. Single-threaded (the
event loop). Does not own per-key quotas (`ratelimit`) or agent jobs (`jobs`, bounded apart).
"""

from __future__ import annotations

import math

from longhaul.serve.openai_api.protocol import APIError


class Admission:
    def __init__(self, running: int, queued: int):
        self.running_slots, self.capacity = running, running + queued
        self.active = 0
        self.mean_duration_s = 1.0  # exponential moving average of admitted requests' durations

    def acquire(self, n: int = 1) -> None:
        if self.active + n > self.capacity:
            turns = max(1.0, (self.active + n - self.running_slots) / self.running_slots)
            retry = max(1, min(60, math.ceil(self.mean_duration_s * turns)))
            raise APIError(503, f"the server is at capacity ({self.active} requests admitted, {self.capacity} allowed); "
                                f"retry in {retry} s", type="server_overloaded", code="server_busy",
                           headers={"Retry-After": str(retry)})
        self.active += n

    def release(self, n: int = 1, duration_s: float | None = None) -> None:
        self.active = max(0, self.active - n)
        if duration_s is not None:
            self.mean_duration_s = 0.9 * self.mean_duration_s + 0.1 * duration_s
