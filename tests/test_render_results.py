"""benchmarks/render_results.py on a tiny docs tree: a table rendered between its markers, the
rest of the page kept, and --check failing once the JSON has moved on."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "render_results.py"
spec = importlib.util.spec_from_file_location("render_results", SCRIPT)
render_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_results)

PAGE = """# Sandbox

Host: a 2-core test host.

<!-- generated:sandbox_throughput -->
stale
<!-- /generated:sandbox_throughput -->

A reading that stays.
"""


def write_tree(root: Path, fast: float) -> Path:
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "docs" / "results").mkdir(parents=True)
    result = {"n": 4, "checks": {"anchor": {"checks_per_s": 10.0, "passed": 4, "ratio_vs_anchor": 1.0},
                                 "fast path": {"checks_per_s": fast, "passed": 4, "ratio_vs_anchor": fast / 10.0}},
              "exec_true": {"p50_ms": 9.26, "p99_ms": 26.72, "n": 300}}
    (root / "benchmarks" / "results" / "sandbox_throughput.json").write_text(json.dumps(result))
    page = root / "docs" / "results" / "sandbox.md"
    page.write_text(PAGE)
    return page


def test_renders_between_markers_and_keeps_the_rest(tmp_path):
    page = write_tree(tmp_path, fast=32.5)
    assert render_results.main(["--root", str(tmp_path)]) == 0
    text = page.read_text()
    assert "stale" not in text
    assert "| fast path | 32.5 | 4/4 | 3.25x |" in text
    assert "p50 9.3 ms, p99 26.7 ms (300 runs)" in text
    assert text.startswith("# Sandbox\n\nHost: a 2-core test host.\n\n<!-- generated:sandbox_throughput -->\n")
    assert text.endswith("<!-- /generated:sandbox_throughput -->\n\nA reading that stays.\n")
    assert not [p for p in page.parent.iterdir() if p.name.endswith(".tmp")]  # the temporary file was renamed away


def test_check_detects_drift_and_writes_nothing(tmp_path):
    page = write_tree(tmp_path, fast=32.5)
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1  # the page still says "stale"
    assert "stale" in page.read_text()
    render_results.main(["--root", str(tmp_path)])
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 0
    rendered = page.read_text()
    data = tmp_path / "benchmarks" / "results" / "sandbox_throughput.json"
    result = json.loads(data.read_text())
    result["checks"]["fast path"]["checks_per_s"] = 40.0
    data.write_text(json.dumps(result))
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1
    assert page.read_text() == rendered


def test_unknown_table_is_named(tmp_path):
    page = write_tree(tmp_path, fast=32.5)
    page.write_text("<!-- generated:nope -->\n<!-- /generated:nope -->\n")
    with pytest.raises(SystemExit, match="no table named 'nope'"):
        render_results.main(["--root", str(tmp_path)])
