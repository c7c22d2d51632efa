"""Run a terminal/multistep task's hidden checker on the host, without a sandbox: the tests use
it to show the checker rejects the start state and placeholder outputs."""

import os
import subprocess
import sys

from longhaul.envs.workspace import HIDDEN_DIR, WorkspaceTask


def materialize(task: WorkspaceTask, root) -> None:
    """The task's starting files and hidden files under `root` (setup commands are not run)."""
    for path, data in task.files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    for path, data in task.hidden_files.items():
        p = root / HIDDEN_DIR / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(data)


def check(root) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(root), "PYTHONNOUSERSITE": "1"}
    return subprocess.run([sys.executable, "-I", f"{HIDDEN_DIR}/check.py"], check=False, cwd=root, capture_output=True,
                          text=True, env=env)
