"""Host uids for sandboxes, one per live sandbox on this machine (when we are root).

A uid is claimed by holding an exclusive `flock` on `/run/longhaul/uids/<uid>`: the kernel
drops the lock when its holder exits however it exits, so a killed caller never leaks its
uid, and two processes never hold the same one. A uid that still has processes (left by a
caller that did not use these claims) is skipped, never reused under them.
"""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.sandbox import procs

UID_BASE, UID_COUNT = 61000, 4000
CLAIMS = Path("/run/longhaul/uids")


class UidClaim:
    def __init__(self, uid: int, fd: int, path: Path):
        self.uid, self._fd, self._path = uid, fd, path

    @classmethod
    def acquire(cls, claims: Path = CLAIMS) -> "UidClaim":
        claims.mkdir(mode=0o700, parents=True, exist_ok=True)
        busy = procs.uids_in_use()
        start = random.randrange(UID_COUNT)
        for i in range(UID_COUNT):
            uid = UID_BASE + (start + i) % UID_COUNT
            if uid in busy:
                continue
            path = claims / str(uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # a holder releasing meanwhile unlinks the file we opened: that lock names no claim
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    return cls(uid, fd, path)
            except (BlockingIOError, FileNotFoundError):
                pass
            os.close(fd)
        raise LonghaulError(f"all {UID_COUNT} sandbox uids ({UID_BASE}..{UID_BASE + UID_COUNT - 1}) are in use; close some sandboxes")

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            self._path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = -1


def sweep_stale(claims: Path = CLAIMS) -> None:
    """Kill what runs as the uid of every claim whose holder has died, then remove the claim."""
    try:
        names = [n for n in os.listdir(claims) if n.isdigit()]
    except OSError:
        return
    for name in names:
        path = claims / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its holder lives
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                procs.reap(procs.kill_uid(int(name)))
                path.unlink()
        except (BlockingIOError, FileNotFoundError):
            pass
        finally:
            os.close(fd)
