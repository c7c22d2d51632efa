"""A joint run's per-domain metrics rows (`runtime.domains.metrics` keys, `domain/<name>/...`) as
HTML: pass rate, share and reward curves, one chart each with the largest domains as lines, and a
totals table, for the run report (`domain_report`) or as `domains.html` beside it
(`write_domain_report`)."""

from __future__ import annotations

import html
import os
from pathlib import Path

from longhaul.eval.svg import line_chart


def domain_names(rows: list[dict]) -> list[str]:
    """Domains that appear in metrics rows, in first-seen order."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k.startswith("domain/") and k.count("/") == 2:
                seen.setdefault(k.split("/")[1], None)
    return list(seen)


def domain_report(rows: list[dict], max_lines: int = 12) -> str:
    """HTML: per-domain pass rate and share curves (the `max_lines` largest domains by episodes
    as lines) and a table of every domain's totals. Empty when no row has domain keys."""
    names = domain_names(rows)
    if not names:
        return ""
    last = {n: next((r for r in reversed(rows) if f"domain/{n}/episodes_total" in r), {}) for n in names}
    total = lambda n, k: last[n].get(f"domain/{n}/{k}_total", 0)
    biggest = sorted(names, key=lambda n: -total(n, "episodes"))[:max_lines]
    charts = []
    for key, title in (("pass_rate", "pass rate by domain"), ("share", "share of draws by domain"), ("reward", "reward by domain")):
        series = {n: ([r["step"] for r in rows if f"domain/{n}/{key}" in r], [r[f"domain/{n}/{key}"] for r in rows if f"domain/{n}/{key}" in r])
                  for n in biggest}
        charts.append(line_chart(series, title, x_label="step"))

    def rate(n: str) -> str:
        done = [r for r in rows if f"domain/{n}/pass_rate" in r]
        eps = sum(r[f"domain/{n}/episodes"] for r in done)
        return f"{sum(r[f'domain/{n}/pass_rate'] * r[f'domain/{n}/episodes'] for r in done) / eps:.3f}" if eps else "-"

    body = "".join(f"<tr><td>{html.escape(n)}</td><td>{total(n, 'episodes')}</td><td>{rate(n)}</td><td>{total(n, 'tokens')}</td>"
                   f"<td>{total(n, 'sandbox_s'):.1f}</td></tr>" for n in names)
    table = ("<table border='1' cellpadding='3' style='border-collapse:collapse;font-size:12px'><tr><th>domain</th><th>episodes</th>"
             "<th>pass rate</th><th>tokens</th><th>sandbox s</th></tr>" + body + "</table>")
    return ("<h2>Domains</h2><div style='display:flex;flex-wrap:wrap;gap:12px'>" + "".join(charts) + "</div>" + table)


def write_domain_report(run_dir: Path, rows: list[dict], title: str = "domains") -> Path | None:
    """`run_dir/domains.html`: the `domain_report` section as a page of its own (atomic); None
    when the rows have no domain keys."""
    section = domain_report(rows)
    if not section:
        return None
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif'><h1>{html.escape(title)}</h1>{section}</body></html>")
    out = Path(run_dir) / "domains.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out
