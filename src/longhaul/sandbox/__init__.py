"""Isolated, limited, audited execution of model-written code.

`Sandbox` (backends `bwrap` and `process`), `SandboxSpec`, `ExecResult`, sessions,
`SandboxPool`, and the forking `PythonChecker` fast path for code checks. The `process`
backend applies rlimits only and is not an isolation boundary; it is used only when chosen
or when bubblewrap is missing (with a warning).
"""

from longhaul.sandbox.checker import CheckerPool, PythonChecker, shared_pool
from longhaul.sandbox.pool import SandboxPool
from longhaul.sandbox.sandbox import Sandbox, SandboxError
from longhaul.sandbox.spec import ExecResult, SandboxSpec

__all__ = ["CheckerPool", "ExecResult", "PythonChecker", "Sandbox", "SandboxError", "SandboxPool", "SandboxSpec", "shared_pool"]
