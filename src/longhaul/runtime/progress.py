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
