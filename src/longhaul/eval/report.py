"""A self-contained HTML report of a run: training curves and the before/after table.

The curves are the console's charts: uPlot (vendored by `make console`) and the series' data,
both inlined, so the file opens anywhere without a network or the console. Where uPlot is not
vendored the curves fall back to plain inline SVG, and the report says so.
"""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path

from longhaul.console.vendor import UPLOT, UPLOT_CSS
from longhaul.eval.domain_report import domain_report

CURVES = [("reward", "reward (train)"), ("pass_rate", "pass rate (train samples)"), ("kl", "KL to reference"),
          ("entropy", "entropy"), ("completions/mean_length", "completion length"), ("step_time", "step time (s)")]
AGENT_CURVES = [("agent/submit_rate", "episodes that submit"), ("agent/turns", "turns an episode"),
                ("agent/invalid_calls", "invalid tool calls an episode"), ("agent/loop_rate", "episodes that repeat a call"),
                ("agent/repair_rate", "repair rate (solved after a failure)")]
AGENT_ROWS = [("submit_rate", "submit", "%"), ("turns_to_submit", "turns to submit", ""), ("invalid_calls", "invalid calls", ""),
              ("loop_rate", "loops", "%"), ("repair_rate", "repair rate", "%")]


def _svg_line(xs: list[float], ys: list[float], title: str, w: int = 420, h: int = 220) -> str:
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and not (isinstance(y, float) and math.isnan(y))]
    pad = 40
    if not pts:
        return f"<svg width='{w}' height='{h}'><text x='10' y='20'>{html.escape(title)}: no data</text></svg>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x1 == x0:
        x1 = x0 + 1
    sx = lambda x: pad + (x - x0) / (x1 - x0) * (w - 2 * pad)
    sy = lambda y: h - pad + (y - y0) / (y1 - y0) * (2 * pad - h)
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    dots = "".join(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.5'/>" for x, y in pts)
    return (
        f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg' font-family='sans-serif' font-size='11'>"
        f"<text x='{pad}' y='16' font-size='13' font-weight='bold'>{html.escape(title)}</text>"
        f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#888'/>"
        f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#888'/>"
        f"<text x='{pad - 4}' y='{sy(y1) + 4:.1f}' text-anchor='end'>{y1:.3g}</text>"
        f"<text x='{pad - 4}' y='{sy(y0) + 4:.1f}' text-anchor='end'>{y0:.3g}</text>"
        f"<text x='{pad}' y='{h - pad + 14}'>{x0:g}</text><text x='{w - pad}' y='{h - pad + 14}' text-anchor='end'>step {x1:g}</text>"
        f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{path}'/><g fill='#1f77b4'>{dots}</g></svg>"
    )


def _comparison_table(cmp: dict) -> str:
    agent = [k for k in AGENT_ROWS if any((cmp[s].get("agent") or {}).get(k[0]) is not None for s in ("base", "trained"))]
    rows = []
    for key in ("base", "trained"):
        s = cmp[key]
        cells = "".join(f"<td>{_fmt((s.get('agent') or {}).get(k), unit)}</td>" for k, _, unit in agent)
        rows.append(f"<tr><td>{key}</td><td>{s['passed']}/{s['n']}</td><td>{100 * s['pass_rate']:.1f}%</td>"
                    f"<td>[{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}]</td>{cells}</tr>")
    t = cmp["mcnemar"]
    lo, hi = cmp["difference_ci95"]
    return (
        "<table border='1' cellpadding='4' style='border-collapse:collapse'><tr><th>policy</th><th>passed</th>"
        "<th>pass rate</th><th>95% interval</th>" + "".join(f"<th>{label}</th>" for _, label, _ in agent) + "</tr>"
        + "".join(rows) + "</table>"
        f"<p>difference {100 * cmp['difference']:+.1f} points (paired bootstrap 95% [{100 * lo:+.1f}, {100 * hi:+.1f}]); "
        f"McNemar exact: gained {t['gained']}, lost {t['lost']}, p = {t['p_value']:.2g} "
        f"({'significant' if cmp['significant'] else 'not significant'} at 95%)</p>" + _group_table(cmp.get("by_group", {}))
    )


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.0f}%" if unit == "%" else f"{value:.2f}"


def _group_table(by_group: dict) -> str:
    """Per sub-family passes before and after, largest gain first, with a bar for each rate."""
    if len(by_group) < 2:
        return ""
    bar = lambda x, c: f"<div style='background:{c};height:8px;width:{int(120 * x)}px'></div>"
    rows = sorted(by_group.items(), key=lambda kv: (kv[1]["trained"] - kv[1]["base"]) / kv[1]["n"], reverse=True)
    body = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v['n']}</td><td>{v['base']}</td><td>{bar(v['base'] / v['n'], '#aaa')}</td>"
        f"<td>{v['trained']}</td><td>{bar(v['trained'] / v['n'], '#1f77b4')}</td></tr>" for k, v in rows)
    return ("<h3>By sub-family</h3><table border='1' cellpadding='3' style='border-collapse:collapse;font-size:12px'>"
            "<tr><th>sub-family</th><th>tasks</th><th>base</th><th></th><th>trained</th><th></th></tr>" + body + "</table>")


FLEX = "<div style='display:flex;flex-wrap:wrap;gap:12px'>"  # the charts side by side, wrapping

# draws each series of DATA into its box the way the console's run page does
_DRAW = """for (const [i, s] of DATA.entries()) new uPlot({
  title: s.title, width: 420, height: 220, scales: { x: { time: false } }, legend: { show: false },
  series: [{ label: "step" }, { label: s.title, stroke: "#1f77b4", width: 1.5, spanGaps: true, points: { show: s.x.length <= 60 } }],
}, [s.x, s.y], document.querySelector('[data-chart="' + i + '"]'));"""


def _finite(y):
    return None if y is None or (isinstance(y, float) and not math.isfinite(y)) else y


def _charts(series: list[tuple[str, list, list]]) -> str:
    """(title, steps, values) curves as uPlot charts with uPlot and the data inlined; plain SVG
    where uPlot is not vendored."""
    if not (UPLOT.is_file() and UPLOT_CSS.is_file()):
        note = "<p><i>Plain charts: uPlot is not vendored here (run <code>make console</code>).</i></p>"
        return note + FLEX + "".join(_svg_line(xs, ys, title) for title, xs, ys in series) + "</div>"
    data = json.dumps([{"title": t, "x": xs, "y": [_finite(y) for y in ys]} for t, xs, ys in series]).replace("</", "<\\/")
    boxes = "".join(f"<div data-chart='{i}'></div>" for i in range(len(series)))
    return (f"<style>{UPLOT_CSS.read_text()}</style>{FLEX}{boxes}</div>"
            f"<script>{UPLOT.read_text()}</script><script>const DATA = {data};\n{_DRAW}</script>")


def write_report(run_dir: Path, metrics: list[dict], comparison: dict | None, title: str, curves=CURVES) -> Path:
    curves = list(curves) + [c for c in AGENT_CURVES if any(c[0] in m for m in metrics)]
    charts = _charts([(label, [m["step"] for m in metrics if k in m], [m[k] for m in metrics if k in m]) for k, label in curves])
    body = f"<h1>{html.escape(title)}</h1>"
    if comparison:
        body += "<h2>Held-out evaluation (greedy, same tasks)</h2>" + _comparison_table(comparison)
    body += f"<h2>Training curves</h2>{charts}"
    if any(k.startswith("domain/") for m in metrics[:1] for k in m):  # a joint multi-domain run
        body += domain_report(metrics)
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body style='font-family:sans-serif'>{body}</body></html>"
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out
