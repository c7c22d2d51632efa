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


def test_agent_demo_table_goes_into_the_readme(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    row = lambda k, n: {"passed": k, "n": n, "pass_rate": k / n, "ci95": [0.1, 0.5]}  # noqa: E731
    demo = {"stages": {"base": row(0, 60), "sft": row(19, 60), "rl": row(21, 60)},
            "transfer": {"base": row(0, 30), "sft": row(0, 30), "rl": row(1, 30)},
            "humaneval": {"base": row(14, 164), "rl": row(13, 164)},
            "sft_vs_base": {"gained": 19, "lost": 0, "p_value": 3.8e-6}, "rl_vs_sft": {"gained": 2, "lost": 0, "p_value": 0.5},
            "ablations": {"rl_from_base": {"trained": row(0, 60), "transfer": row(0, 30), "vs_sft_rl": {"p_value": 9.5e-7}}},
            "timing_s": {"total": 2066.3}, "host": "a test host", "measured_at": "2026-12-05T10:02:00"}
    (tmp_path / "benchmarks" / "results" / "agent_demo.json").write_text(json.dumps(demo))
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- generated:agent_demo -->\n<!-- /generated:agent_demo -->\nrest\n")
    assert render_results.render(tmp_path) == [readme]
    text = readme.read_text()
    assert "| SFT + multi-turn GRPO | 21/60 (35.0%) [10, 50] | 1/30 | 13/164 |" in text
    assert "| ablation: RL from base, no SFT | 0/60 (0.0%) [10, 50] | 0/30 | - |" in text
    assert "rl vs sft: 2 gained, 0 lost, exact McNemar p = 0.5" in text
    assert "Host: a test host; measured 2026-12-05" in text and text.endswith("<!-- /generated:agent_demo -->\nrest\n")
    assert render_results.render(tmp_path, check=True) == []


def test_a_team_run_and_its_variants_become_the_multi_agent_table(tmp_path):
    spec = importlib.util.spec_from_file_location("multi_agent", SCRIPT.parent / "multi_agent.py")
    multi_agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(multi_agent)
    stage = lambda k, tokens: {"passed": k, "n": 30, "pass_rate": k / 30, "ci95": [0.1, 0.5], "infra_errors": 0,  # noqa: E731
                               "roles": {"navigator": {"tokens": tokens}, "driver": {"tokens": 1}}}
    summary = {"workflow": "navigator_driver", "family": "multistep", "model": "smollm2-135m-instruct", "policies": "shared",
               "stages": {"base": stage(0, 999), "rl": stage(12, 99)}, "rl_vs_base": {"gained": 12, "lost": 0, "p_value": 4.9e-4},
               "timing_s": {"eval_base": 714.3, "demos": 7.8, "sft_shared": 546.4, "rl": 196.6, "eval_rl": 91.7},
               "config": {"budgets": {"max_turns": 4}, "subfamilies": None}, "measured_at": "2026-12-07T08:00:00",
               "compared": {"single": {"stages": {"base": {**stage(0, 0), "roles": {"agent": {"tokens": 5}}}},
                                       "timing_s": {"eval_base": 600.0, "demos": 5.0, "sft_shared": 60.0},
                                       "rl_vs_single_rl": {"gained": 1, "lost": 8, "p_value": 0.039}}}}
    res = multi_agent.result(summary, "longhaul team train examples/team.yaml")
    assert res["seconds"]["shared"] == {"training": 750.8, "evaluation": 806.0, "stages": summary["timing_s"]}
    assert set(res["tests"]) == {"rl_vs_base", "rl_vs_single_rl"} and res["held_out"] == 30
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "multi_agent.json").write_text(json.dumps(res))
    (tmp_path / "docs" / "results").mkdir(parents=True)
    page = tmp_path / "docs" / "results" / "multi_agent.md"
    page.write_text("<!-- generated:multi_agent -->\n<!-- /generated:multi_agent -->\n")
    render_results.render(tmp_path)
    text = page.read_text()
    assert "| team, one shared policy | rl | 12/30 | **40.0%** [10.0%, 50.0%] | 100 | 0 |" in text
    assert "| single agent | base | 0/30 | **0.0%** [10.0%, 50.0%] | 5 | 0 |" in text
    assert "| rl vs single rl | 1 | 8 | 0.039 |" in text and "| team, one shared policy | 13 min | 13 min |" in text
