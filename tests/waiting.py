"""Waiting in tests without racing the clock: poll a condition up to a generous deadline
(`wait_until`), or hold a thread at a known point until the test lets it go on (`Gate`).
A deadline here only bounds a hang; no test asserts how fast anything is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEADLINE_S = 120.0  # far beyond anything a test waits for, on a loaded machine too


def wait_until(cond: Callable, timeout: float = DEADLINE_S, interval: float = 0.01, what: str = ""):
    """Poll `cond()` until it returns something true and return that; fail after `timeout` s."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= end:
            raise AssertionError(f"still waiting after {timeout:g} s for {what or getattr(cond, '__name__', cond)}")
        time.sleep(interval)


class Gate:
    """Holds the thread that calls it, the first time `when()` is true, until `open()`.

    Install it as a hook the code under test calls from its own thread (e.g.
    `LLMEngine.step_hook`, called before each step); `wait()` returns once that thread is held,
    so the test acts at a known point (load weights, abort, hang up) instead of racing it."""

    def __init__(self, when: Callable[[], bool] = lambda: True, timeout: float = DEADLINE_S):
        self.when, self.timeout = when, timeout
        self.reached, self._opened = threading.Event(), threading.Event()

    def __call__(self, *_args) -> None:
        if self.reached.is_set() or self._opened.is_set() or not self.when():
            return
        self.reached.set()
        if not self._opened.wait(self.timeout):
            raise TimeoutError(f"the test did not open the gate within {self.timeout:g} s")

    def wait(self, alive: Callable[[], bool] = lambda: True, timeout: float = DEADLINE_S) -> None:
        """Until a thread is held here; fails as soon as `alive()` is false without that."""
        wait_until(lambda: self.reached.is_set() or not alive(), timeout, what="a thread to reach the gate")
        assert self.reached.is_set(), "the thread ended without reaching the gate"

    def open(self) -> None:
        self._opened.set()
