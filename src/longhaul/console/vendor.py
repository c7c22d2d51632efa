"""The front-end library `make console` vendors into `static/vendor/` (uPlot, from npm), for the
console's pages and for the charts inlined in a run's static `report.html`."""

from __future__ import annotations

from pathlib import Path

VENDOR = Path(__file__).parent / "static" / "vendor"
UPLOT = VENDOR / "uPlot.iife.min.js"
UPLOT_CSS = VENDOR / "uPlot.min.css"
