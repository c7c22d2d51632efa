"""The console in a real headless Chromium against a real server on loopback: the runs list,
a run's charts drawn, a metrics line appended on disk appearing without a reload, and an
episode whose long tool output is shown whole."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import threading

import pytest

from longhaul.console.app import create_app
from longhaul.console.vendor import UPLOT
from longhaul.envs.scene3d.browser import ARGS, chromium_path
from longhaul.errors import LonghaulError
from tests.console.runs_on_disk import LONG_OUTPUT, make_runs
from tests.waiting import wait_until

TIMEOUT_MS = 20_000


def _needs_browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed; pip install -e '.[scene3d]'")
    if not UPLOT.is_file():
        pytest.skip("uPlot is not vendored into the console; run `make console`")
    try:
        chromium_path()
    except LonghaulError as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def serving(root, **app_options):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(root, **app_options), log_config=None, access_log=False))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    try:
        wait_until(lambda: server.started, what="the console server to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        th.join(30)
        sock.close()


# pixels of a canvas that are neither transparent nor white: a drawn chart has thousands
INKED = """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240)) n++; return n; }"""


@contextlib.contextmanager
def console_page(tmp_path, **app_options):
    """(runs directory, base URL, a page) over a fresh runs directory; page errors fail the test."""
    _needs_browser()
    from playwright.sync_api import sync_playwright

    root = make_runs(tmp_path / "runs")
    with serving(root, **app_options) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=list(ARGS))
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield root, base, page
            assert not errors, errors
        finally:
            browser.close()


def test_runs_page_run_charts_live_metrics_and_a_whole_episode(tmp_path):
    with console_page(tmp_path) as (root, base, page):
        page.goto(base + "/")
        page.click('tr[data-run="grpo-tiny"] a')
        page.wait_for_url("**/run?name=grpo-tiny")

        canvas = page.wait_for_selector('.chart[data-metric="reward"] canvas')
        assert canvas.evaluate(INKED) > 200
        assert "line 4 is not valid JSON" in page.inner_text("#metric-warnings")
        assert "base" in page.inner_text("#eval-table") and "name: grpo-tiny" in page.inner_text("#config")

        # a line appended on disk shows up in place: the poll appends, the page does not reload
        page.evaluate("window.__same_page = true")
        with (root / "grpo-tiny" / "metrics.jsonl").open("a") as f:
            f.write('{"step": 7, "reward": 0.7, "fresh/metric": 3.0}\n')
        page.wait_for_selector('.chart[data-metric="fresh/metric"] canvas')
        assert page.evaluate("window.__same_page") is True

        page.wait_for_selector('#episodes tbody a[href*="id=1.0"]')
        page.click('#episodes tbody a[href*="id=1.0"]')
        page.wait_for_url("**/episode?**")
        page.wait_for_selector(".turn.tool pre.content")
        shown = page.eval_on_selector_all(".turn.tool pre.content", "ps => ps.map(p => p.innerText)")
        assert any(LONG_OUTPUT in s for s in shown), [len(s) for s in shown]
        clipped = page.eval_on_selector_all("pre.content", "ps => ps.filter(p => p.scrollHeight > p.clientHeight + 1).length")
        assert clipped == 0
        # the episode's sandbox audit log: its set-up, its session's commands and its check
        page.wait_for_selector("#audit table.audit tbody tr")
        audit = page.inner_text("#audit")
        assert "grep -rn TODO src" in audit and "session" in audit and "check" in audit and "test -d /work" in audit


def test_a_deleted_run_says_so_on_its_page(tmp_path):
    with console_page(tmp_path) as (root, base, page):
        page.goto(base + "/run?name=live&poll=200")
        page.wait_for_selector('.chart[data-metric="reward"] canvas')
        shutil.rmtree(root / "live")
        wait_until(lambda: "deleted" in page.inner_text("#messages"), what="the page to say the run was deleted")


def test_environments_page_shows_each_family_and_why_a_task_fails(tmp_path, monkeypatch):
    from tests.console.runs_on_disk import FAILING_REASON, make_manifest

    monkeypatch.setenv("LONGHAUL_ENVCHECK_MANIFEST", str(make_manifest(tmp_path / "manifest.json")))
    with console_page(tmp_path) as (root, base, page):
        page.goto(base + "/")
        page.click('a[href="/environments"]')
        page.wait_for_selector('#families tr[data-family="funcgen"]')
        assert "stale" in page.inner_text('#families tr[data-family="multistep"]')
        assert "38 / 40" in page.inner_text('#families tr[data-family="funcgen"]')
        assert FAILING_REASON in page.inner_text('section[data-family="funcgen"] table.problems')


def test_playground_streams_a_reply_from_a_served_model(tmp_path):
    from tests.serve.conftest import running_server

    _needs_browser()
    with running_server(tmp_path / "serve") as (served, _), console_page(tmp_path, serve=served) as (root, base, page):
        page.goto(base + "/")
        page.click('a[href="/playground"]')
        page.wait_for_selector('#model option[value="tiny-llama"]', state="attached")
        page.fill("#prompt", "hello there")
        page.click("#send")
        page.wait_for_selector('.turn.assistant[data-done="true"]')
        assert page.inner_text('.turn.user pre') == "hello there"
        assert page.inner_text('.turn.assistant pre').strip()  # the streamed reply, shown
        assert page.inner_text("#messages") == ""


def test_the_static_report_draws_the_consoles_charts_offline(tmp_path):
    """report.html carries uPlot and the curves inline: opened from disk with no server, every
    curve with data is drawn; a diverged value is a gap, and a title cannot end the script."""
    _needs_browser()
    from playwright.sync_api import sync_playwright

    from longhaul.eval.report import write_report

    metrics = [{"step": s, "reward": s / 30, "kl": float("nan") if s == 7 else 0.01 * s, "step_time": 2.0} for s in range(1, 31)]
    out = write_report(tmp_path, metrics, None, "run </script><b>x</b>",
                       curves=[("reward", "reward"), ("kl", "KL </script>"), ("step_time", "step time"), ("absent", "none")])
    page_text = out.read_text()
    assert "<svg" not in page_text and page_text.count("<div data-chart=") == 4
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=list(ARGS))
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri())
            page.wait_for_function("() => document.querySelectorAll('[data-chart] canvas').length === 4", timeout=TIMEOUT_MS)
            inked = page.eval_on_selector_all("[data-chart] canvas", f"cs => cs.map({INKED})")
            assert not errors, errors
            assert all(n > 200 for n in inked[:3]), inked
            assert "KL </script>" in page.inner_text('[data-chart="1"]')
        finally:
            browser.close()


def test_without_uplot_the_report_falls_back_to_svg_and_says_so(tmp_path, monkeypatch):
    from longhaul.eval import report

    monkeypatch.setattr(report, "UPLOT", tmp_path / "missing.js")
    out = report.write_report(tmp_path, [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.7}], None, "t",
                              curves=[("reward", "reward")])
    page = out.read_text()
    assert page.count("<svg") == 1 and "uPlot is not vendored" in page and "make console" in page
