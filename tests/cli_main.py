"""The `longhaul` command run in the test's own process: `longhaul.cli.main` with the arguments,
in the working directory, its output and exit status captured the way `subprocess.run` returns
them. It runs the command's own code without a second interpreter's start-up (several seconds
of imports); tests of the entry point itself (a traceback with --debug, signals) keep a real
process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess


def run_main(*args: str, cwd) -> subprocess.CompletedProcess:
    from longhaul.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["longhaul", *args], code, out.getvalue(), err.getvalue())
