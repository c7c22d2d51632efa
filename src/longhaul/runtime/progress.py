"""Progress bars with rates and ETA (rich), quiet when disabled."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=False, highlight=False)


@contextmanager
def progress_bar(enabled: bool = True, stderr: bool = False):
    """`stderr=True` keeps stdout clean for machine-readable output (`--json`)."""
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    out = Console(stderr=True, highlight=False) if stderr else console
    with Progress(*cols, console=out, disable=not enabled, transient=False) as prog:
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
