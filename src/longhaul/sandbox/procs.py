"""Host processes as the sandbox sees them: parent links read from /proc, who owns a
leftover (a pid and its start time, so a reused pid is not mistaken for its owner), the
sandbox's pid-namespace init, and killing and reaping without cgroups.

Everything here reads /proc and sends signals; it never waits on a pid it did not start
or just kill (`reap`), so callers' own subprocesses keep their exit statuses.
"""

from __future__ import annotations

import os
import select
import signal
import time


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], starttime [19])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ppid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[1]) if f else None


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, for every process this pid namespace shows."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat_fields(int(name))
            if f:
                kids.setdefault(int(f[1]), []).append(int(name))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before their children."""
    kids, out, todo = children_map(), [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _pid_ns() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def owner_token(pid: int | None = None) -> str:
    """`<pid>.<start time>.<pid namespace>`: names this process in leftovers' names until it
    exits, even once its pid is reused or seen from another pid namespace sharing /tmp."""
    pid = pid or os.getpid()
    f = _stat_fields(pid)
    return f"{pid}.{f[19]}.{_pid_ns()}" if f else str(pid)


def owner_alive(token: str) -> bool:
    """Whether the process a token names still runs. A bare pid (no start time) is alive while
    any process has it; an owner in another pid namespace, or a token we cannot read, counts as alive."""
    pid, _, rest = token.partition(".")
    start, _, ns = rest.partition(".")
    if not pid.isdigit() or (ns and ns != _pid_ns()):
        return True
    f = _stat_fields(int(pid))
    if f is None or f[0] in ("Z", "X"):
        return False
    return not start or f[19] == start


def pidfd(pid: int) -> int | None:
    """A pidfd (readable once `pid` has exited), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` s for our child `pid` to exit, without reaping it."""
    fd = pidfd(pid)
    if fd is not None:
        try:
            poller = select.poll()  # not select(): a caller may hold more than FD_SETSIZE descriptors
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(timeout * 1000))
        finally:
            os.close(fd)
    end = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)


def ns_init(monitor: int, timeout: float = 2.0) -> int | None:
    """The host pid of the sandbox's pid 1: bubblewrap's one child. bubblewrap clones it at
    once; until it has (or if it has exited), wait up to `timeout` s; None if it never shows."""
    end = time.monotonic() + timeout
    while True:
        kids = children_map().get(monitor, [])
        if kids:
            return kids[0]
        state = _stat_fields(monitor)
        if time.monotonic() >= end or state is None or state[0] in ("Z", "X"):
            return None
        time.sleep(0.01)


def kill_child_of(parent: int, pid: int) -> bool:
    """SIGKILL `pid` if it is still `parent`'s child (a pidfd pins it, so a reused pid is never hit)."""
    fd = pidfd(pid)
    try:
        if ppid(pid) != parent:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def kill_pids(pids, sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def uid_pids(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (the owner of /proc/<pid> can differ for undumpable ones)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            out.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            pass
    return out


def uids_in_use() -> set[int]:
    """Real uids of every running process."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            out.add(int(line.split()[1]))
                            break
            except (OSError, ValueError, IndexError):
                pass
    return out


def kill_uid(uid: int) -> list[int]:
    """SIGKILL every process running as `uid` until none is left (a fork bomb refills between
    passes); returns what was killed, for `reap`."""
    killed: set[int] = set()
    for _ in range(50):
        pids = uid_pids(uid)
        if not pids:
            break
        kill_pids(pids)
        killed.update(pids)
        time.sleep(0.005)
    return sorted(killed)


def reap(pids, timeout: float = 1.0) -> None:
    """Reap the given killed processes that became our children (we are the host's init, as in
    a container, or a subreaper): nobody else would, and each zombie pins its cgroups. A killed
    process is reparented as it dies, so each is given up to `timeout` s to settle."""
    me, end = os.getpid(), time.monotonic() + timeout
    for pid in pids:
        while True:
            f = _stat_fields(pid)
            if f is None or (f[0] in ("Z", "X") and int(f[1]) != me):
                break  # gone, or a zombie its own parent will reap
            if int(f[1]) == me and f[0] in ("Z", "X"):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                break
            if time.monotonic() >= end:
                break
            time.sleep(0.002)
