"""`longhaul team train`'s HTML report: held-out pass@1 by stage with per-role figures (tokens,
invalid calls, messages sent, each an episode's mean), the paired tests, the compared variants
(a single agent, the other policy setting), the RL curves by role, and held-out team episodes
turn by turn: each turn marked with its role and how it ended, that role's replies and tool
outputs, and the messages between roles. Reads what `runtime.team_train` wrote; owns
presentation only.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from longhaul.console.episodes import team_turns
from longhaul.eval.pipeline_report import _pct, _tests, write_page
from longhaul.eval.svg import line_chart
from longhaul.runtime.metrics import read_metrics

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]  # one a role, in the workflow's order
PER_EPISODE = (("tokens", "tokens"), ("invalid_calls", "invalid calls"), ("messages_sent", "messages"))


def _stage_table(stages: dict) -> str:
    roles = list(next(iter(stages.values()))["roles"])
    head = ("<tr><th>stage</th><th>passed</th><th>pass@1</th><th>95% interval</th><th>infra errors</th>"
            + "".join(f"<th>{html.escape(r)}: {label}</th>" for r in roles for _, label in PER_EPISODE) + "</tr>")
    body = ""
    for stage, s in stages.items():
        cells = ""
        for r in roles:
            row = s["roles"].get(r, {})
            n = max(1, row.get("episodes", 0))
            cells += "".join(f"<td>{row.get(k, 0) / n:.1f}</td>" for k, _ in PER_EPISODE)
        body += (f"<tr><td>{html.escape(stage)}</td><td>{s['passed']}/{s['n']}</td><td>{_pct(s['pass_rate'])}</td>"
                 f"<td>[{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}]</td><td>{s['infra_errors']}</td>{cells}</tr>")
    return f"<table>{head}{body}</table><p><small>per-role columns: an episode's mean</small></p>"


def _compared(summary: dict) -> str:
    out = []
    for name, c in summary.get("compared", {}).items():
        out += [f"<h3>{html.escape(name)}</h3>", _stage_table(c["stages"]), _tests(c)]
    return "".join(out)


def _curves(run_dir: Path, roles: list[str]) -> str:
    rl = read_metrics(run_dir)
    if not rl:
        return "<p>no RL curves (no RL stage)</p>"
    steps = [m["step"] for m in rl]

    def series(key: str) -> tuple[list, list]:
        return [m["step"] for m in rl if key in m], [m[key] for m in rl if key in m]

    charts = [line_chart({"team reward": (steps, [m["reward"] for m in rl])}, "RL: team reward of the samples", "step"),
              line_chart({r: series(f"role/{r}/reward_share") for r in roles}, "RL: each role's share of the reward", "step"),
              line_chart({r: series(f"role/{r}/tokens") for r in roles}, "RL: tokens a role an episode", "step"),
              line_chart({r: series(f"role/{r}/invalid_calls") for r in roles}, "RL: invalid calls a role an episode", "step")]
    return f"<div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(charts)}</div>"


def load_team_episodes(run_dir: Path, stage: str) -> dict[str, dict[str, dict]]:
    """task id -> role -> that role's row of `episodes_<stage>.jsonl`."""
    p = run_dir / f"episodes_{stage}.jsonl"
    out: dict[str, dict[str, dict]] = {}
    for row in map(json.loads, p.read_text().splitlines()) if p.exists() else []:
        out.setdefault(row["task_id"], {})[row["role"]] = row
    return out


def _passed(ep: dict) -> bool:
    return bool(next(iter(ep.values()))["passed"])


def _episode(ep: dict[str, dict], color: dict[str, str]) -> str:
    first = next(iter(ep.values()))
    why = f": {first['why']}" if first.get("why") else ""
    task = next((m["content"] for m in first.get("messages", [])[1:2]), "")
    parts = [f"<p><b>{'passed' if _passed(ep) else 'failed'}</b> ({html.escape(first['ended'] + why)})</p>",
             f"<div class='t'><small>task</small><pre>{html.escape(task)}</pre></div>"]
    for t, msgs in team_turns(ep):
        c = color.get(t["role"], "#555")
        body = "".join(f"<div><small>{html.escape(m['role'])}</small><pre>{html.escape(str(m.get('content', '')))}</pre></div>"
                       for m in msgs)
        parts.append(f"<div style='border-left:4px solid {c};padding-left:6px;margin:6px 0'>"
                     f"<b style='color:{c}'>turn {t['turn']}: {html.escape(t['role'])}</b> <small>({html.escape(str(t['outcome']))})"
                     f"</small>{body}</div>")
    notes = first.get("team_messages", [])
    if notes:
        items = "".join(f"<li>turn {n.get('turn', '?')}: <b style='color:{color.get(n['from'], '#555')}'>{html.escape(n['from'])}</b>"
                        f" to {html.escape(n['to'])}: {html.escape(n['text'])}</li>" for n in notes)
        parts.append(f"<p><small>messages between roles</small></p><ul>{items}</ul>")
    return "".join(parts)


def shown_team_episodes(run_dir: Path, stages: list[str], show: int) -> list[tuple[str, dict, dict]]:
    """(task id, first stage's episode, last stage's): the tasks the last stage passed and the
    first did not, then the other passes, then the rest."""
    a, b = load_team_episodes(run_dir, stages[0]), load_team_episodes(run_dir, stages[-1])
    common = [t for t in a if t in b]
    order = sorted(common, key=lambda t: (not (_passed(b[t]) and not _passed(a[t])), not _passed(b[t])))
    return [(t, a[t], b[t]) for t in order[:max(0, show)]]


def write_team_report(run_dir: Path, summary: dict, show: int = 3) -> Path:
    stages = list(summary["stages"])
    roles = list(summary["stages"][stages[-1]]["roles"])
    color = {r: COLORS[i % len(COLORS)] for i, r in enumerate(roles)}
    who = "the single-agent counterpart of " if summary.get("solo") else ""
    body = [f"<h1>longhaul team: {who}{html.escape(summary['workflow'])} on {html.escape(summary['family'])}</h1>",
            f"<p>{html.escape(summary['model'])}, policies {html.escape(summary['policies'])}; host {html.escape(str(summary.get('host')))}; "
            f"measured {summary['measured_at']}; stage seconds {html.escape(json.dumps(summary['timing_s']))}</p>",
            "<h2>Held-out team pass@1, greedy, the same tasks for every stage</h2>", _stage_table(summary["stages"]), _tests(summary)]
    if summary.get("compared"):
        body += ["<h2>Variants, on the same held-out tasks</h2>", _compared(summary)]
    body += ["<h2>Training</h2>", _curves(run_dir, roles), f"<h2>Held-out episodes turn by turn, {stages[0]} and {stages[-1]}</h2>"]
    for tid, a, b in shown_team_episodes(run_dir, stages, show):
        body.append(f"<h3>{html.escape(tid)}</h3><div class='cols'><div><h4>{stages[0]}</h4>{_episode(a, color)}</div>"
                    f"<div><h4>{stages[-1]}</h4>{_episode(b, color)}</div></div>")
    return write_page(run_dir / "report.html", f"longhaul team {summary['workflow']}", body)
