import json
import shutil

import pytest

from longhaul.errors import LonghaulError
from longhaul.sandbox import Sandbox, SandboxSpec
from tests.cli_main import run_main


def test_process_backend_applies_limits_without_isolation():
    with Sandbox(SandboxSpec(wall_s=5, cpu_s=1, output_bytes=4096), backend="process") as sb:
        r = sb.exec(["sh", "-c", "echo hi; pwd"])
        assert r.ok and r.stdout.splitlines()[0] == "hi" and r.stdout.splitlines()[1] == str(sb.workdir)
        assert sb.exec(["sleep", "30"], timeout=0.3).limit_hit == "wall"
        assert sb.exec(["yes"]).limit_hit == "output"
        assert sb.exec(["python3", "-c", "while True: pass"], timeout=120).limit_hit == "cpu"  # 1 s of CPU, however loaded


def test_unknown_backend_is_an_error():
    with pytest.raises(LonghaulError, match="unknown sandbox backend"):
        Sandbox(backend="docker")


def test_spec_rejects_bad_limits():
    with pytest.raises(ValueError, match="memory_bytes"):
        SandboxSpec(memory_bytes=0)
    with pytest.raises(ValueError, match="network"):
        SandboxSpec(network="host")


def _cli(*args):
    return run_main("sandbox", "run", *args, cwd=".")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_cli_json_and_exit_codes():
    r = _cli("--json", "--wall", "5", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert r.returncode == 3
    res = json.loads(r.stdout)
    assert set(res) >= {"exit_code", "signal", "stdout", "stderr", "truncated", "limit_hit", "wall_s", "cpu_s", "peak_rss"}
    assert res["stdout"] == "out\n" and res["stderr"] == "err\n" and res["exit_code"] == 3
    r = _cli("--allow", "python3", "--", "sh", "-c", "true")
    assert r.returncode == 126 and "not allowed" in r.stderr
    r = _cli("--wall", "0.5", "--", "sleep", "30")
    assert r.returncode == 137 and "wall limit" in r.stderr
    r = _cli("--net", "bogus", "--", "true")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
