"""The agent pipeline's HTML report: the stage table (pass rate, interval, agent metrics), the
paired tests, each evaluation set and the held-out sub-families apart, HumanEval, the SFT and RL
curves, and held-out episodes shown turn by turn before and after (tool calls with their full
outputs). Reads what `runtime.pipeline` wrote; owns presentation only.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from longhaul.eval.svg import bar_chart, line_chart
from longhaul.runtime.metrics import read_metrics

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
         "td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px}pre{white-space:pre-wrap;background:#f6f6f6;padding:6px;"
         "font-size:12px;margin:2px 0;max-height:420px;overflow:auto}.a{border-left:3px solid #1f77b4;padding-left:6px}"
         ".t{border-left:3px solid #aaa;padding-left:6px}.cols{display:flex;gap:16px}.cols>div{flex:1;min-width:0}")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _stage_table(rows: dict) -> str:
    credit = any("mean_reward" in r for r in rows.values())  # partial credit, where the family gives it
    head = ("<tr><th>stage</th><th>passed</th><th>pass@1</th><th>95% interval</th>" + "<th>mean reward [95%]</th>" * credit +
            "<th>submit</th><th>turns to submit</th><th>invalid calls</th><th>loops</th><th>repair rate</th></tr>")
    body = ""
    for stage, r in rows.items():
        a = r.get("agent") or {}
        tts = a.get("turns_to_submit")
        mr = (f"<td>{r['mean_reward']:.3f} [{r['mean_reward_ci95'][0]:.3f}, {r['mean_reward_ci95'][1]:.3f}]</td>" if "mean_reward" in r
              else "<td>-</td>") if credit else ""
        body += (f"<tr><td>{html.escape(stage)}</td><td>{r['passed']}/{r['n']}</td><td>{_pct(r['pass_rate'])}</td>"
                 f"<td>[{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]</td>{mr}<td>{_pct(a.get('submit_rate'))}</td>"
                 f"<td>{'-' if tts is None else f'{tts:.1f}'}</td><td>{a.get('invalid_calls', 0):.2f}</td>"
                 f"<td>{_pct(a.get('loop_rate'))}</td><td>{_pct(a.get('repair_rate'))}</td></tr>")
    return f"<table>{head}{body}</table>"


def _tests(summary: dict) -> str:
    out = []
    for key, m in summary.items():
        if isinstance(m, dict) and "p_value" in m:
            out.append(f"<li>{html.escape(key.replace('_', ' '))}: gained {m['gained']}, lost {m['lost']}, exact McNemar p = {m['p_value']:.3g}</li>")
    return f"<ul>{''.join(out)}</ul>" if out else ""


def _sets(summary: dict) -> str:
    sets = summary["by_set"]
    if not sets:
        return ""
    stages = list(summary["stages"])
    rows = "".join(f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{v[s]['passed']}/{v[s]['n']} ({_pct(v[s]['pass_rate'])})</td>"
                                                               for s in stages) + "</tr>" for k, v in sets.items())
    chart = bar_chart(list(sets), {s: [sets[k][s]["pass_rate"] for k in sets] for s in stages}, "pass@1 by set", "pass rate", w=720)
    return (f"<table><tr><th>set</th>{''.join(f'<th>{s}</th>' for s in stages)}</tr>{rows}</table>{chart}")


def _curves(run_dir: Path) -> str:

    charts = []
    sft = read_metrics(run_dir / "sft")
    if sft:
        charts.append(line_chart({k: ([m["step"] for m in sft if k in m], [m[k] for m in sft if k in m]) for k in ("loss", "heldout/loss")},
                                 "SFT: token loss (assistant turns)", "step"))
    rl = read_metrics(run_dir / "rl")
    for keys, title in ((("reward", "pass_rate"), "RL: reward and pass rate of the samples"),
                        (("agent/submit_rate", "agent/repair_rate", "agent/loop_rate"), "RL: agent behaviour"),
                        (("agent/turns", "agent/invalid_calls"), "RL: turns and invalid calls an episode"),
                        (("step_time", "timing/gen"), "RL: seconds a step")):
        if rl and any(k in m for m in rl for k in keys):
            charts.append(line_chart({k: ([m["step"] for m in rl if k in m], [m[k] for m in rl if k in m]) for k in keys}, title, "step"))
    return f"<div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(charts)}</div>" if charts else "<p>no training curves</p>"


def _episode(ep: dict) -> str:
    parts = [f"<p><b>{'passed' if ep.get('passed') else 'failed'}</b> ({html.escape(str(ep.get('status')))})</p>"]
    for m in ep.get("messages", [])[1:]:  # the system prompt is the same for every episode
        cls = "a" if m["role"] == "assistant" else "t"
        parts.append(f"<div class='{cls}'><small>{m['role']}</small><pre>{html.escape(m['content'])}</pre></div>")
    return "".join(parts)


def _load_episodes(run_dir: Path, stage: str) -> dict:
    p = run_dir / f"episodes_{stage}.jsonl"
    return {e["task_id"]: e for e in map(json.loads, p.read_text().splitlines())} if p.exists() else {}


def shown_episodes(run_dir: Path, stages: list[str], show: int) -> list[tuple[str, dict, dict]]:
    """(task id, first stage's episode, last stage's) of the held-out episodes the report shows:
    those the last stage passed and the first did not, then the other passes, then the rest."""
    first, last = _load_episodes(run_dir, stages[0]), _load_episodes(run_dir, stages[-1])
    if not first or not last or show <= 0:
        return []
    common = [t for t in first if t in last]
    order = sorted(common, key=lambda t: (not (last[t]["passed"] and not first[t]["passed"]), not last[t]["passed"]))
    return [(t, first[t], last[t]) for t in order[:show]]


def picture_path(run_dir: Path, stage: str, task_id: str) -> Path:
    """Where the pipeline puts a picture of what a shown episode built (families that render them)."""
    return run_dir / "pictures" / f"{stage}__{task_id.replace('/', '_')}.png"


def _picture(run_dir: Path, stage: str, task_id: str) -> str:
    p = picture_path(run_dir, stage, task_id)
    return f"<img src='{html.escape(p.relative_to(run_dir).as_posix())}' width='480' alt='the scene it built'>" if p.is_file() else ""


def _episodes(run_dir: Path, stages: list[str], show: int) -> str:
    out = []
    for tid, a, b in shown_episodes(run_dir, stages, show):
        out.append(f"<h3>{html.escape(tid)}</h3><div class='cols'>"
                   f"<div><h4>{stages[0]}</h4>{_picture(run_dir, stages[0], tid)}{_episode(a)}</div>"
                   f"<div><h4>{stages[-1]}</h4>{_picture(run_dir, stages[-1], tid)}{_episode(b)}</div></div>")
    return "".join(out)


def write_pipeline_report(run_dir: Path, summary: dict) -> Path:
    cfg = summary["config"]
    stages = list(summary["stages"])
    body = [f"<h1>longhaul pipeline: {html.escape(cfg['name'])}</h1>",
            f"<p>{html.escape(cfg['model']['name'])} on {', '.join(map(html.escape, cfg['families']))}; "
            f"host {html.escape(str(summary.get('host')))}; measured {summary['measured_at']}; "
            f"stage seconds {html.escape(json.dumps(summary['timing_s']))}</p>",
            "<h2>Held-out pass@1, greedy, the same tasks for every stage</h2>", _stage_table(summary["stages"]), _tests(summary),
            "<h2>By set</h2>", _sets(summary)]
    if summary.get("transfer"):
        body += ["<h2>Held-out sub-families (never trained on)</h2>", _stage_table(summary["transfer"])]
    if summary.get("humaneval"):
        body += ["<h2>HumanEval pass@1 (greedy)</h2>", _stage_table(summary["humaneval"])]
    body += ["<h2>Training</h2>", _curves(run_dir),
             f"<h2>Held-out episodes, {stages[0]} and {stages[-1]}</h2>", _episodes(run_dir, stages, cfg["eval"]["show"])]
    return write_page(run_dir / "report.html", f"longhaul pipeline {cfg['name']}", body)


def write_page(out: Path, title: str, body: list[str]) -> Path:
    """An HTML page with the reports' style, written to a temporary name and renamed."""
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out
