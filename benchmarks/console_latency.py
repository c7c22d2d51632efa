"""How fast the console answers over a large runs directory, one run.

Writes a runs directory of `--runs` finished runs (a config, a report, `--small-steps` metrics
lines each) and one run of `--steps` steps of `--metrics` metrics, serves the console over it
on loopback (`longhaul console` in its own process, as a user runs it), and times:
- the API: `GET /api/runs` (first call, then warm), the large run's whole metrics history in
  pages (first read, then warm), and an incremental poll after the last line;
- the pages in headless Chromium (Playwright, Debian's `chromium`): the runs page until every
  run's row is drawn, and the large run's page until every metric's chart is drawn, each from
  navigation start (recorded in the page by an observer of its DOM); the first load, then the
  median and the worst of `--repeats` more, and for the worst load where its slowest API
  request spent its time (waiting for a connection, to its first byte, its body).

    python benchmarks/console_latency.py [--runs 500] [--steps 10000] [--metrics 50]

Prints a table and writes `benchmarks/results/console_latency.json` (through a temporary file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from render_results import write_atomic
from rich.console import Console
from rich.table import Table

from longhaul.config import RunConfig, dump_config
from longhaul.console.vendor import UPLOT
from longhaul.envinfo import collect

HERE = Path(__file__).resolve().parent
console = Console(stderr=True)


def write_run(d: Path, name: str, steps: int, metrics: int) -> None:
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(dump_config(RunConfig(name=name, model={"name": "tiny-llama"})))
    keys = ["reward", "pass_rate", "kl"] + [f"extra/m{i:02d}" for i in range(max(0, metrics - 3))]
    with (d / "metrics.jsonl").open("w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "time": 1.7e9 + s, **{k: round(((s * 7 + i * 13) % 101) / 100, 4)
                                                                 for i, k in enumerate(keys)}}) + "\n")
    (d / "report.html").write_text("<html></html>")  # finished: the report is as new as the data


@contextlib.contextmanager
def serving(root: Path):
    """`longhaul console` over `root` in its own process, as a user runs it; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "longhaul.cli", "console", "--runs", str(root), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the static page: ready without reading any run (the first listing is timed)
            if proc.poll() is not None:
                raise SystemExit(f"longhaul console exited {proc.returncode}: {proc.stderr.read().strip()[-300:]}")
            try:
                urllib.request.urlopen(base + "/", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the console did not answer within 60 s") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def get(url: str) -> tuple[dict, float]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = json.loads(r.read())
    return body, time.perf_counter() - t


def whole_metrics(base: str, run: str, columns: bool = False) -> tuple[int, float, int]:
    """(rows, seconds, next line) of a run's whole history, read in pages: as rows, or as the run
    page reads it (columns, pages of up to 50,000 lines)."""
    after, rows, total = 0, 0, 0.0
    query = "format=columns&limit=50000&" if columns else ""
    while True:
        body, dt = get(f"{base}/api/runs/{run}/metrics?{query}after={after}")
        total += dt
        rows += len(body["x"] if columns else body["rows"])
        after = body["next"]
        if not body["more"]:
            return rows, total, after


def api_timings(base: str, runs: int, big: str, repeats: int) -> dict:
    body, cold = get(base + "/api/runs")
    if len(body["runs"]) != runs + 1:
        raise SystemExit(f"/api/runs listed {len(body['runs'])} runs, expected {runs + 1}")
    warm = min(get(base + "/api/runs")[1] for _ in range(repeats))
    rows, first, last = whole_metrics(base, big)
    again = min(whole_metrics(base, big)[1] for _ in range(repeats))
    columns = min(whole_metrics(base, big, columns=True)[1] for _ in range(repeats))
    poll = min(get(f"{base}/api/runs/{big}/metrics?after={last}")[1] for _ in range(repeats))
    return {"runs_list_first_s": cold, "runs_list_warm_s": warm, "metrics_rows": rows, "metrics_whole_first_s": first,
            "metrics_whole_warm_s": again, "metrics_columns_s": columns, "metrics_poll_s": poll}


# the load's slowest API request as the browser saw it: waiting for a connection, the server's
# time to the first byte, and the body's transfer (seconds)
SLOWEST_API = """() => { const e = performance.getEntriesByType('resource').filter(r => r.name.includes('/api/'))
  .sort((a, b) => b.duration - a.duration)[0];
  return e && { url: e.name.replace(location.origin, ''), queued_s: (e.requestStart - e.startTime) / 1000,
                first_byte_s: (e.responseStart - e.requestStart) / 1000, body_s: (e.responseEnd - e.responseStart) / 1000,
                total_s: e.duration / 1000 }; }"""


def page_timings(base: str, runs: int, big: str, metrics: int, repeats: int) -> dict | str:
    """Seconds from navigation start until the pages are drawn, or why they could not be timed."""
    try:
        from playwright.sync_api import sync_playwright

        from longhaul.envs.scene3d.browser import ARGS, chromium_path
        exe = chromium_path()
    except Exception as e:  # no playwright or no chromium: the API figures still stand
        return f"pages not timed: {e}"
    if not UPLOT.is_file():
        return "pages not timed: uPlot is not vendored (make console)"
    # the moment a page is drawn, recorded in the page itself by an observer of its DOM (polling it
    # from Playwright adds its own delay, up to seconds on two busy cores)
    rows_drawn = f"document.querySelectorAll('#runs tbody tr').length >= {runs + 1}"
    charts_drawn = f"document.querySelectorAll('.chart canvas').length >= {metrics}"
    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=list(ARGS))
        try:
            for key, url, ready in (("runs_page_s", base + "/", rows_drawn), ("run_page_s", f"{base}/run?name={big}", charts_drawn)):
                page = browser.new_page()
                page.set_default_timeout(120_000)
                page.add_init_script("new MutationObserver((_, obs) => { if (window.__drawnAt === undefined && (%s)) "
                                     "{ window.__drawnAt = performance.now(); obs.disconnect(); } })"
                                     ".observe(document, { childList: true, subtree: true });" % ready)
                times, slowest = [], []
                for _ in range(repeats + 1):  # the first load also fills the browser's cache of the scripts
                    page.goto(url)
                    page.wait_for_function("() => window.__drawnAt !== undefined")
                    times.append(page.evaluate("() => window.__drawnAt") / 1000)
                    slowest.append(page.evaluate(SLOWEST_API))
                page.close()
                later = sorted(range(1, len(times)), key=lambda i: times[i])
                out[key] = times[later[len(later) // 2]]
                out[key + "_first"] = times[0]
                out[key + "_worst"] = times[later[-1]]
                out[key + "_worst_api"] = slowest[later[-1]]
        finally:
            browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500, help="small finished runs besides the large one")
    ap.add_argument("--small-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the large run")
    ap.add_argument("--metrics", type=int, default=50, help="metrics a step of the large run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "console_latency.json"))
    args = ap.parse_args()
    if args.runs < 1 or args.steps < 1 or args.metrics < 3:
        raise SystemExit("--runs and --steps must be at least 1, --metrics at least 3 (reward, pass_rate, kl)")

    with tempfile.TemporaryDirectory(prefix="console-latency-") as tmp:
        root = Path(tmp) / "runs"
        t0 = time.perf_counter()
        for i in range(args.runs):
            write_run(root / f"run-{i:04d}", f"run-{i:04d}", args.small_steps, 8)
        write_run(root / "big", "big", args.steps, args.metrics)
        console.print(f"console_latency: wrote {args.runs + 1} runs in {time.perf_counter() - t0:.1f} s; serving")
        with serving(root) as base:
            api = api_timings(base, args.runs, "big", args.repeats)
            pages = page_timings(base, args.runs, "big", args.metrics, args.repeats)

    table = Table(title=f"console latency: {args.runs + 1} runs, one of {args.steps:,} steps x {args.metrics} metrics")
    table.add_column("what")
    table.add_column("seconds", justify="right")
    for key, label in (("runs_list_first_s", "GET /api/runs, first"), ("runs_list_warm_s", "GET /api/runs, warm"),
                       ("metrics_whole_first_s", f"the large run's {api['metrics_rows']:,} metrics rows, first read"),
                       ("metrics_whole_warm_s", "the same, warm"),
                       ("metrics_columns_s", "the same as columns (what the run page reads), warm"),
                       ("metrics_poll_s", "a poll after the last line")):
        table.add_row(label, f"{api[key]:.3f}")
    if isinstance(pages, dict):
        for key, label in (("runs_page_s_first", "runs page drawn, first load"), ("runs_page_s", "runs page drawn, median"),
                           ("runs_page_s_worst", "runs page drawn, worst"),
                           ("run_page_s_first", f"the large run's page, {args.metrics} charts drawn, first load"),
                           ("run_page_s", f"the large run's page, {args.metrics} charts drawn, median"),
                           ("run_page_s_worst", f"the large run's page, {args.metrics} charts drawn, worst")):
            table.add_row(label, f"{pages[key]:.3f}")
    else:
        table.add_row(pages, "-")
    Console(width=140).print(table)
    for key in ("runs_page_s_worst_api", "run_page_s_worst_api"):
        if isinstance(pages, dict) and pages.get(key):
            a = pages[key]
            console.print(f"{key[:-10]} worst load, its slowest API request {a['url']}: waited {a['queued_s']:.3f} s for a "
                          f"connection, {a['first_byte_s']:.3f} s to the first byte, {a['body_s']:.3f} s for the body")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"runs": args.runs + 1, "small_steps": args.small_steps, "steps": args.steps, "metrics": args.metrics,
            "repeats": args.repeats, "host": collect()["cpu"], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "api": api, "pages": pages if isinstance(pages, dict) else {"skipped": pages}}
    write_atomic(out, json.dumps(data, indent=1) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
