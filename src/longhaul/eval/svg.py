"""Inline SVG charts for self-contained HTML reports: several series on one line chart, and
grouped bars. No plotting dependency; `report._svg_line` stays the one-series chart of a run's
training curves. Every chart is one `<svg>` string with a title, axis ranges and a legend.
"""

from __future__ import annotations

import html
import math

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 52, 16, 28, 34


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


def _head(w: int, h: int, title: str) -> str:
    return (f"<svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg' font-family='sans-serif' font-size='11'>"
            f"<text x='{_PAD_L}' y='16' font-size='13' font-weight='bold'>{html.escape(title)}</text>")


def _legend(names: list[str], x: float, y: float) -> str:
    return "".join(f"<rect x='{x:.1f}' y='{y + 14 * i - 8:.1f}' width='10' height='10' fill='{PALETTE[i % len(PALETTE)]}'/>"
                   f"<text x='{x + 14:.1f}' y='{y + 14 * i + 1:.1f}'>{html.escape(n)}</text>" for i, n in enumerate(names))


def _axes(w: int, h: int, plot_w: int, x0, x1, y0, y1, x_label: str, y_label: str) -> str:
    bottom = h - _PAD_B
    return (f"<line x1='{_PAD_L}' y1='{bottom}' x2='{_PAD_L + plot_w}' y2='{bottom}' stroke='#888'/>"
            f"<line x1='{_PAD_L}' y1='{_PAD_T}' x2='{_PAD_L}' y2='{bottom}' stroke='#888'/>"
            f"<text x='{_PAD_L - 4}' y='{_PAD_T + 4}' text-anchor='end'>{y1:.3g}</text>"
            f"<text x='{_PAD_L - 4}' y='{bottom + 4}' text-anchor='end'>{y0:.3g}</text>"
            f"<text x='{_PAD_L}' y='{bottom + 14}'>{x0:.4g}</text>"
            f"<text x='{_PAD_L + plot_w}' y='{bottom + 14}' text-anchor='end'>{x1:.4g}</text>"
            f"<text x='{_PAD_L + plot_w / 2:.1f}' y='{h - 6}' text-anchor='middle'>{html.escape(x_label)}</text>"
            f"<text x='12' y='{(_PAD_T + bottom) / 2:.1f}' transform='rotate(-90 12 {(_PAD_T + bottom) / 2:.1f})' "
            f"text-anchor='middle'>{html.escape(y_label)}</text>")


def line_chart(series: dict[str, tuple[list, list]], title: str, x_label: str = "", y_label: str = "",
               w: int = 460, h: int = 240, y_min: float | None = None, y_max: float | None = None) -> str:
    """One line per series (name -> (xs, ys)); None/NaN points are skipped; legend on the right."""
    clean = {n: [(x, y) for x, y in zip(xs, ys) if _finite(x) and _finite(y)] for n, (xs, ys) in series.items()}
    pts = [p for ps in clean.values() for p in ps]
    if not pts:
        return f"<svg width='{w}' height='{h}'><text x='10' y='20'>{html.escape(title)}: no data</text></svg>"
    legend_w = 12 + 7 * max(len(n) for n in clean) if len(clean) > 1 else 0
    plot_w = w - _PAD_L - _PAD_R - legend_w
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0 = min(p[1] for p in pts) if y_min is None else y_min
    y1 = max(p[1] for p in pts) if y_max is None else y_max
    if y1 <= y0:
        y0, y1 = y0 - 0.5, y0 + 0.5
    if x1 <= x0:
        x1 = x0 + 1
    sx = lambda x: _PAD_L + (x - x0) / (x1 - x0) * plot_w
    sy = lambda y: h - _PAD_B - (min(max(y, y0), y1) - y0) / (y1 - y0) * (h - _PAD_B - _PAD_T)
    lines = []
    for i, (name, ps) in enumerate(clean.items()):
        colour = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
        dots = "".join(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2'/>" for x, y in ps) if len(ps) <= 60 else ""
        lines.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.8' points='{path}'/><g fill='{colour}'>{dots}</g>")
    legend = _legend(list(clean), _PAD_L + plot_w + 8, _PAD_T + 6) if legend_w else ""
    return _head(w, h, title) + _axes(w, h, plot_w, x0, x1, y0, y1, x_label, y_label) + "".join(lines) + legend + "</svg>"


def bar_chart(groups: list[str], series: dict[str, list[float]], title: str, y_label: str = "",
              w: int = 460, h: int = 240) -> str:
    """Grouped bars: one group per label in `groups`, one bar per series in each, value on top."""
    vals = [v for vs in series.values() for v in vs if _finite(v)]
    if not vals or not groups:
        return f"<svg width='{w}' height='{h}'><text x='10' y='20'>{html.escape(title)}: no data</text></svg>"
    legend_w = 12 + 7 * max(len(n) for n in series)
    plot_w = w - _PAD_L - _PAD_R - legend_w
    top = max(max(vals), 0.0) or 1.0
    bottom = h - _PAD_B
    group_w = plot_w / len(groups)
    bar_w = group_w * 0.8 / len(series)
    out = [_head(w, h, title), f"<line x1='{_PAD_L}' y1='{bottom}' x2='{_PAD_L + plot_w}' y2='{bottom}' stroke='#888'/>",
           f"<text x='12' y='{(_PAD_T + bottom) / 2:.1f}' transform='rotate(-90 12 {(_PAD_T + bottom) / 2:.1f})' "
           f"text-anchor='middle'>{html.escape(y_label)}</text>"]
    for g, label in enumerate(groups):
        gx = _PAD_L + g * group_w + group_w * 0.1
        for s, (name, vs) in enumerate(series.items()):
            v = vs[g] if g < len(vs) and _finite(vs[g]) else 0.0
            bh = max(v, 0.0) / top * (bottom - _PAD_T - 12)
            x = gx + s * bar_w
            out.append(f"<rect x='{x:.1f}' y='{bottom - bh:.1f}' width='{bar_w * 0.92:.1f}' height='{bh:.1f}' fill='{PALETTE[s % len(PALETTE)]}'/>"
                       f"<text x='{x + bar_w / 2:.1f}' y='{bottom - bh - 3:.1f}' text-anchor='middle' font-size='9'>{v:.3g}</text>")
        out.append(f"<text x='{_PAD_L + (g + 0.5) * group_w:.1f}' y='{bottom + 14}' text-anchor='middle'>{html.escape(label)}</text>")
    out.append(_legend(list(series), _PAD_L + plot_w + 8, _PAD_T + 6))
    return "".join(out) + "</svg>"
