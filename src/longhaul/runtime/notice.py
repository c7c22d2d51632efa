"""The stop notice: how a training run leaves when its scheduler takes its machine back.

Cluster schedulers pre-empt with a notice: Kubernetes sends SIGTERM and waits out the pod's
grace period, Slurm sends the signal `--signal` names (SIGUSR1 here). While a `StopNotice` is
open, either signal only marks the run as told to stop; the training loop finishes the step it
is on (an update is never left half applied), saves a checkpoint, and leaves with
`StopRequested` (exit status 143, 128 + SIGTERM), so `longhaul train ... --resume` continues
from exactly that step. A second signal of the same kind gets the default action again (the
process dies at once; checkpoints are written to a temporary directory and renamed, so the last
complete one is intact either way).

Owned here: the handlers and the error. Not owned: what a checkpoint holds (`rl.checkpoint`),
and the workers' processes (rollout workers and data-parallel ranks are closed by the loop on its
way out, as after any error). Handlers exist only in the main thread; a loop in another thread (a
Ray trainer actor's) hears a notice through `StopNotice.deliver`, which tells every notice open in
its process what a signal would (`ray_backend.train_in_actor` forwards the driver's signal so).
"""

from __future__ import annotations

import signal
import threading

from longhaul.errors import LonghaulError

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested(LonghaulError):
    """The run stopped on a notice after saving its checkpoint."""
    exit_code = 128 + signal.SIGTERM
    label = "stopped"


def leave_to_the_parent() -> None:
    """In a child process of a run (a rollout worker, a data-parallel rank): ignore the stop
    signals, which Slurm and a process-group kill send to every process; the run's loop hears
    them, saves and closes its children itself."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class StopNotice:
    """While open (a `with` block), the stop signals mark the run as told to stop (`received`)."""
    _open: set["StopNotice"] = set()  # the notices open in this process: a signal reaches each of them

    def __init__(self):
        self.received: str | None = None  # the name of the first signal that arrived
        self._previous: dict = {}

    def __enter__(self) -> "StopNotice":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        StopNotice._open.add(self)
        return self

    def __exit__(self, *exc) -> None:
        StopNotice._open.discard(self)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @classmethod
    def deliver(cls, name: str) -> int:
        """Tell every notice open in this process that `name` (e.g. "SIGTERM") arrived, as the
        signal itself would; returns how many were open."""
        for notice in list(cls._open):
            notice.received = notice.received or name
        return len(cls._open)

    def _on_signal(self, signum, frame) -> None:
        self.received = self.received or signal.Signals(signum).name
        signal.signal(signum, signal.SIG_DFL)  # a second one stops the process at once

    def checkpoint_due(self, step: int, steps: int, every: int) -> bool:
        """Whether the loop saves after `step` of `steps`: the last one, every `every` (0: never), or told to stop."""
        return step == steps or bool(self.received) or bool(every and step % every == 0)

    def end_if_told(self, step: int, steps: int, checkpoint, log) -> None:
        """After the checkpoint of `step` is saved: a run told to stop (and not at its end) closes
        `log` and ends with `StopRequested`."""
        if self.received and step < steps:
            log.close()
            raise StopRequested(f"{self.received} received: stopped after step {step} of {steps} with its checkpoint at "
                                f"{checkpoint}; run the same `longhaul train` command with --resume to continue from there")
