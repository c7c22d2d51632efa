"""What the hand-run benchmarks share: the host's CPU model (and count), a nearest-rank
percentile, and writing a result's JSON so that a reader never sees half of it.

Scripts import it as a sibling (`sys.path` holds the benchmarks folder when one runs).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> str:
    """The CPU model and how many CPUs the OS shows, e.g. "AMD EPYC, 2 CPUs"."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs"


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def write_json(result: dict, out: Path) -> None:
    """`out` gets the result whole (a temporary file, then a rename), and says so."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")
