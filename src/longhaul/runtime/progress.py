"""Progress bars with rates and ETA (rich), quiet when disabled."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=False, highlight=False)


class _LoggedProgress(Progress):
    """Progress for output that is not a terminal (a log file, a CI job), where rich draws the bars
    only once, at the end: a plain line per task with its rate and ETA every `every` seconds."""

    def __init__(self, *cols, every: float, **kw):
        super().__init__(*cols, **kw)
        self._every, self._said = every, {}

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._say(task_id)

    def _say(self, task_id) -> None:
        task, now = self._tasks[task_id], self.get_time()
        if self.disable or task.finished or now - self._said.setdefault(task_id, now) < self._every:
            return
        self._said[task_id] = now
        done, elapsed = task.completed, task.elapsed or 0.0
        rate = done / elapsed if elapsed else 0.0
        eta = f"{timedelta(seconds=round((task.total - done) / rate))}" if rate and task.total else "?"
        total = f"/{task.total:g}" if task.total else ""
        self.console.print(f"{task.description}: {done:g}{total}, {rate:.3g}/s, elapsed "
                           f"{timedelta(seconds=round(elapsed))}, eta {eta}", highlight=False)


@contextmanager
def progress_bar(enabled: bool = True, stderr: bool = False, every: float = 30.0):
    """`stderr=True` keeps stdout clean for machine-readable output (`--json`). Where the output is
    not a terminal, a line of each task's progress every `every` seconds stands in for the bar."""
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    out = Console(stderr=True, highlight=False) if stderr else console
    kind = Progress if out.is_terminal else lambda *c, **kw: _LoggedProgress(*c, every=every, **kw)
    with kind(*cols, console=out, disable=not enabled, transient=False) as prog:
        yield prog


def named_bars(prefix: str, stderr: bool = False):
    """`factory(name, total)`: a context manager of one bar labelled `prefix name` that yields
    `advance(k)`; for work that opens its bars itself (envcheck's families, a team's episodes)."""
    @contextmanager
    def bar(name, total):
        with progress_bar(True, stderr=stderr) as prog:
            t = prog.add_task(f"{prefix} {name}", total=total, info="")
            yield lambda k: prog.advance(t, k)

    return bar
