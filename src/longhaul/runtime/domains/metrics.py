"""Per-domain metrics of a joint run: pass rate, reward, tokens, sandbox time, share of slots.

`DomainMetrics` counts one domain's episodes since the last `flush()` (a training step) and in
total; `flat()` gives the `domain/<name>/...` keys that go to metrics.jsonl. `domain_report`
renders those rows as an HTML section (pass rate, share and reward curves, one chart each with
the largest domains as lines, and a totals table) for the run report; `write_domain_report`
writes it as `domains.html` beside it.

Keys per domain and step (`<m>` = `domain/<name>/`): `<m>episodes`, `<m>pass_rate`,
`<m>reward` (the verifier's reward, before the domain's shaping), `<m>tokens`, `<m>sandbox_s`, `<m>draws`,
`<m>share` (the domain's fraction of the step's draws), `<m>infra_errors`; and running totals
`<m>episodes_total`, `<m>tokens_total`, `<m>sandbox_s_total`. Rate keys are absent in a step
where the domain had no episode (never NaN).
"""

from __future__ import annotations

import html
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from longhaul.eval.svg import line_chart


@dataclass
class Counts:
    episodes: int = 0
    passes: int = 0
    reward: float = 0.0  # sum of the verifier's rewards
    tokens: int = 0
    sandbox_s: float = 0.0
    draws: int = 0
    infra_errors: int = 0


@dataclass
class DomainMetrics:
    name: str
    step: Counts = field(default_factory=Counts)
    total: Counts = field(default_factory=Counts)

    def add(self, reward: float, passed: bool | None, tokens: int, sandbox_s: float) -> None:
        for c in (self.step, self.total):
            c.tokens += tokens
            c.sandbox_s += sandbox_s
            if passed is None:
                c.infra_errors += 1
            else:
                c.episodes += 1
                c.passes += bool(passed)
                c.reward += reward

    def drawn(self) -> None:
        self.step.draws += 1
        self.total.draws += 1

    def flat(self, step_draws: int) -> dict:
        m, s, t = f"domain/{self.name}/", self.step, self.total
        out = {f"{m}episodes": s.episodes, f"{m}tokens": s.tokens, f"{m}sandbox_s": round(s.sandbox_s, 6),
               f"{m}draws": s.draws, f"{m}infra_errors": s.infra_errors, f"{m}episodes_total": t.episodes,
               f"{m}tokens_total": t.tokens, f"{m}sandbox_s_total": round(t.sandbox_s, 6)}
        if s.episodes:
            out[f"{m}pass_rate"] = s.passes / s.episodes
            out[f"{m}reward"] = s.reward / s.episodes
        if step_draws:
            out[f"{m}share"] = s.draws / step_draws
        return out

    def flush(self) -> None:
        self.step = Counts()

    def state_dict(self) -> dict:
        return {"step": asdict(self.step), "total": asdict(self.total)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.total = Counts(**state["step"]), Counts(**state["total"])


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
