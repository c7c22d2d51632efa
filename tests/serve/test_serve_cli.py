"""`longhaul serve` input errors: one line, exit 2, before anything listens."""

import subprocess
import sys


def serve(*args):
    return subprocess.run([sys.executable, "-m", "longhaul.cli", "serve", *args], capture_output=True, text=True, timeout=120)


def test_unknown_model_and_bad_options_are_one_line_errors(tmp_path):
    r = serve("--model", "no-such-model", "--port", "0", "--jobs-db", str(tmp_path / "j.sqlite"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: model directory 'no-such-model' not found; pass a built-in name, a directory or a URL"]
    r = serve("--model", "tiny-llama", "--dtype", "int3", "--jobs-db", str(tmp_path / "j.sqlite"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --dtype:") and len(r.stderr.strip().splitlines()) == 1
    r = serve("--model", "tiny-llama", "--queue", "kafka://x", "--jobs-db", str(tmp_path / "j.sqlite"))
    assert r.returncode == 2 and "--queue must be sqlite or redis://" in r.stderr
