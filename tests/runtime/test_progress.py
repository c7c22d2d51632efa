"""Progress where the output is not a terminal: rich draws its bars only at the end there, so a
plain line with the count, rate and ETA stands in for them while the work runs."""

import io
import re
import time

from rich.console import Console

import longhaul.runtime.progress as progress


def _bar(monkeypatch, steps: int, every: float, enabled: bool = True) -> list[str]:
    out = io.StringIO()
    monkeypatch.setattr(progress, "console", Console(file=out, force_terminal=False, width=120))
    with progress.progress_bar(enabled, every=every) as prog:
        task = prog.add_task("eval base", total=steps, info="")
        for _ in range(steps):
            time.sleep(0.05)
            prog.advance(task)
    return out.getvalue().splitlines()


def test_a_log_gets_a_line_with_rate_and_eta_at_the_interval(monkeypatch):
    lines = _bar(monkeypatch, steps=8, every=0.12)
    said = [line for line in lines if line.startswith("eval base:")]
    assert 1 <= len(said) < 8, lines  # at the interval, not at every step
    m = re.fullmatch(r"eval base: (\d)/8, ([\d.]+)/s, elapsed (\d+:\d\d:\d\d), eta (\d+:\d\d:\d\d)", said[0])
    assert m, said[0]
    assert 0 < int(m.group(1)) < 8 and 0 < float(m.group(2)) <= 20.5  # a step takes at least 0.05 s
    assert any("8/8" in line for line in lines[len(said):])  # then rich's own last drawing of the bar


def test_a_disabled_bar_says_nothing(monkeypatch):
    assert _bar(monkeypatch, steps=4, every=0, enabled=False) == []
