"""What a workdir stores, for a sandbox whose workdir is a plain host directory (an unprivileged
caller cannot mount a tmpfs for it): the runner's watchdog samples it while a command runs and
stops the command once it has grown past `disk_bytes`.

`stored_bytes` counts allocated blocks (sparse files count what they hold), each inode once
(hard links), and never follows symlinks. A directory the program made unreadable is made
readable again first: the sandbox runs as the caller's uid then, so the caller owns it.
"""

from __future__ import annotations

import os
import stat
import time


def stored_bytes(root: str | os.PathLike) -> int:
    seen: set[tuple[int, int]] = set()
    total, stack = 0, [os.fspath(root)]
    while stack:
        path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            try:
                os.chmod(path, 0o700)
                entries = list(os.scandir(path))
            except OSError:
                continue
        except OSError:  # removed while we looked
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(e.path)
    return total


class StorageWatch:
    """Polls a workdir during one command: `over()` is true once it stores more than `cap` bytes
    and more than it did when the command started (a command may still clean up a workdir an
    earlier one left over the cap). The interval stretches when a walk is slow, so a tree of many
    files costs at most about 5% of a core."""

    def __init__(self, root: str | os.PathLike, cap: int, interval: float = 0.05):
        self.root, self.interval = root, interval
        t = time.monotonic()
        self.limit = max(cap, stored_bytes(root))
        self._cost = time.monotonic() - t
        self._next = time.monotonic() + self._wait()

    def _wait(self) -> float:
        return max(self.interval, 20 * self._cost)

    def due(self) -> float:
        """Seconds until the next sample is due (0: now)."""
        return max(0.0, self._next - time.monotonic())

    def over(self, force: bool = False) -> bool:
        """Sample now if due (or `force`); true when the workdir has grown past the cap."""
        now = time.monotonic()
        if not force and now < self._next:
            return False
        used = stored_bytes(self.root)
        self._cost = time.monotonic() - now
        self._next = time.monotonic() + self._wait()
        return used > self.limit


def wait_s(watch: StorageWatch | None, left: float, idle: float) -> float:
    """How long a watchdog may block before its next look: until the deadline `left` seconds away,
    at most `idle`, and no later than `watch`'s next sample when there is a watch."""
    return max(0.0, min(left, idle if watch is None else max(0.005, watch.due())))
