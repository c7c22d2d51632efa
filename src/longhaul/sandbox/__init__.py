"""Execution of model-written code.

For now one backend, `process`: a child process with rlimits and a wall-clock kill of its
whole process group. It is NOT an isolation boundary (no namespaces); the bubblewrap
backend of the sandbox issue replaces it behind the same call.
"""

from longhaul.sandbox.process import ExecResult, run_python, run_many

__all__ = ["ExecResult", "run_python", "run_many"]
