"""The multi-turn workspace environment: a task's files in a sandbox, tools to work on them, and
hidden tests that decide the reward.

`WorkspaceEnv` implements the Env protocol (`longhaul.envs.base`). The agent sees `/work` with the
task's files (a git repository where the task says so), pytest, ruff and git, and no network. Its
tool calls run in one sandbox shell session, so `cd` and exported variables persist. Hidden
checks never enter that sandbox: `verify()` stops the agent's processes, copies the final
workdir into a fresh sandbox, adds the hidden files there and runs the hidden command.

Model output never raises here. A malformed call, an unknown tool, a path outside /work, a
write over the size limit, a patch that does not apply or a command that runs past its timeout
becomes an observation the model can act on; an error inside longhaul itself ends the episode
as `infra_error`, which trainers mask out instead of scoring as a failure.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace

from longhaul.envs import patch as patchlib
from longhaul.envs import toolchain
from longhaul.envs.base import StepResult
from longhaul.envs.tools import ToolCall, check_arguments, describe, format_call, parse_message, schemas
from longhaul.sandbox import Sandbox, SandboxSpec
from longhaul.sandbox.bwrap import expose
from longhaul.sandbox.sandbox import SandboxError
from longhaul.sandbox.audit import AuditLog
from longhaul.types import Score

HIDDEN_DIR = ".longhaul_hidden"  # where verify() puts hidden files, in the verify copy only
# Exit code 3 from this preamble means a Python file of the solution does not compile.
_COMPILE_CHECK = ("python3 -I - <<'LONGHAUL_EOF' || exit 3\nimport os, sys\nfor d, dirs, files in os.walk('.'):\n"
                  "    dirs[:] = [x for x in dirs if not x.startswith('.')]\n    for f in files:\n"
                  "        if f.endswith('.py'):\n            p = os.path.join(d, f)\n            try:\n"
                  "                compile(open(p, 'rb').read(), p, 'exec')\n            except (SyntaxError, ValueError) as e:\n"
                  "                print('does not compile:', p, e); sys.exit(3)\nLONGHAUL_EOF\n")

SYSTEM_PROMPT = """You are an autonomous software engineer working in a Linux workspace at /work.
Work step by step: look at the files, make a change, run it, read any error and repair it, run the tests, then submit.
To use a tool, reply with exactly one call in this form and nothing after it:
<tool_call>
{{"name": "TOOL", "arguments": {{...}}}}
</tool_call>
The tools (arguments marked ? are optional; paths are relative to /work):
{tools}"""


@dataclass(frozen=True)
class Action:
    """One tool call of a reference solution (what the oracle agent does)."""
    tool: str
    args: dict = field(default_factory=dict)

    def text(self) -> str:
        return format_call(self.tool, **self.args)


@dataclass(frozen=True)
class WorkspaceTask:
    task_id: str  # "family/vVERSION/seed"
    family: str
    version: str
    seed: int
    difficulty: int
    subfamily: str
    instruction: str  # the user message
    files: dict  # path -> str | bytes: the workdir the agent starts with
    hidden_files: dict  # path (under .longhaul_hidden/) -> str | bytes, present only in verify()
    verify_command: str  # bash in the verify copy's /work; exit 0 means solved
    reference: tuple = ()  # Actions that solve the task through the tools (submit is added by the oracle)
    setup: tuple = ()  # bash commands run once at reset, before the agent (e.g. `git init`)
    test_command: str | None = None  # what run_tests runs (the visible tests); None: the task has none
    check_python: bool = True  # verify() first fails with status "syntax" when a .py file does not compile
    verify_timeout_s: float = 60.0
    prompt: str = ""  # filled from `instruction`; single-turn code paths read `prompt`

    def __post_init__(self):
        if not self.prompt:
            object.__setattr__(self, "prompt", self.instruction)


@dataclass(frozen=True)
class WorkspaceLimits:
    """What one episode may do. Observation caps keep a flood of output from filling the context."""
    max_observation_chars: int = 6000
    max_write_bytes: int = 256 << 10
    default_timeout_s: float = 30.0
    max_timeout_s: float = 120.0
    max_calls_per_turn: int = 4  # further calls in one reply are refused with a note
    spec: SandboxSpec = field(default_factory=lambda: SandboxSpec(wall_s=30.0, cpu_s=60.0, memory_bytes=768 << 20, pids=128))


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


def failed_output(text: str) -> bool:
    """Whether a tool's result reports a failure: a refused call, or a command (or the tests)
    that exited non-zero or was stopped. Counted so that the agent's repairs can be measured."""
    if text.startswith("error:"):
        return True
    last = text.rstrip().rsplit("\n", 1)[-1]
    return last.startswith("[stopped") or (last.startswith("[exit code ") and last != "[exit code 0]")


def _spec(base: SandboxSpec) -> SandboxSpec:
    tools = str(toolchain.toolchain_dir())
    return replace(base, ro_binds=(*base.ro_binds, (expose(tools), toolchain.MOUNT)), env=toolchain.sandbox_env(base.env))


class WorkspaceEnv:
    """One episode at a time over WorkspaceTasks; reusable after `close()`."""

    def __init__(self, limits: WorkspaceLimits | None = None, backend: str | None = None, audit=None):
        self.limits = limits or WorkspaceLimits()
        self.backend = backend
        self.audit = audit if audit is not None else AuditLog.from_env()  # a run's audit.jsonl (`log.audit`)
        self._spec = None
        self.sb: Sandbox | None = None
        self.session = None
        self.task: WorkspaceTask | None = None
        self.submitted = False
        self.calls = 0

    # ---- protocol ---------------------------------------------------------------------
    def tools(self) -> list[dict]:
        return schemas()

    def reset(self, task: WorkspaceTask, seed: int = 0) -> tuple[list[dict], dict]:
        self.close()
        self._spec = self._spec or _spec(self.limits.spec)
        self.task, self.submitted, self.calls = task, False, 0
        self.sb = Sandbox(self._spec, backend=self.backend, audit=self.audit)
        for path, data in task.files.items():
            self.sb.write_file(path, data)
        for cmd in task.setup:
            r = self.sb.exec(["bash", "-c", cmd])
            if not r.ok:
                raise SandboxError(f"setup of task {task.task_id} failed ({cmd!r}): {r.stderr.strip()[-300:]}")
        self.session = self.sb.open_session()
        return self.initial_messages(task), {"task_id": task.task_id, "family": task.family, "version": task.version,
                                             "sandbox": self.sb.id}  # the audit log's key for this episode

    @staticmethod
    def initial_messages(task: WorkspaceTask) -> list[dict]:
        """The system prompt (tools and call format) and the task's instruction."""
        system = SYSTEM_PROMPT.format(tools=describe(schemas()))
        return [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}]

    def step(self, message: dict | str) -> StepResult:
        calls = parse_message(message)
        if not calls:
            note = ("No tool call found in your reply. Call one tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, "
                    "or call submit when you are done.")
            return StepResult([{"role": "user", "content": note}], 0.0, False, False, {"tool_calls": 0, "invalid_calls": 1})
        observations, infra, invalid, failed = [], None, 0, 0
        for k, call in enumerate(calls):
            if k >= self.limits.max_calls_per_turn:
                observations.append(self._obs(call, f"error: only {self.limits.max_calls_per_turn} tool calls are run per reply; "
                                                    "this one was skipped"))
                continue
            self.calls += 1
            bad = bool(call.error or check_arguments(call))
            invalid += bad
            try:
                text = self._execute(call)
            except (SandboxError, OSError, ValueError, UnicodeError) as e:  # caused by the call: the model can fix it
                text = f"error: {e}"
            except Exception as e:  # a fault of ours, not the model's
                infra = f"{type(e).__name__}: {e}"
                break
            failed += not bad and failed_output(text)  # a valid call that failed: what a repair starts from
            observations.append(self._obs(call, text))
            if self.submitted:
                break
        info = {"tool_calls": len(calls), "invalid_calls": invalid, "failed_calls": failed}
        if infra:
            info["infra_error"] = infra
            return StepResult(observations, 0.0, False, True, info)
        return StepResult(observations, 0.0, self.submitted, False, info)

    def verify(self) -> Score:
        """Run the hidden check on a fresh copy of the final workdir; the agent's processes are stopped first."""
        if self.sb is None or self.task is None:
            raise RuntimeError("verify() needs a reset() episode")
        if self.session is not None:
            self.session.close()
            self.session = None
        task = self.task
        with Sandbox(self._spec, backend=self.backend, audit=self.audit, episode=self.sb.id) as fresh:
            fresh.import_tree(self.sb.workdir)
            planted = fresh.workdir / HIDDEN_DIR  # whatever the agent put there is not ours
            if planted.exists() or planted.is_symlink():
                shutil.rmtree(planted) if planted.is_dir() and not planted.is_symlink() else planted.unlink()
            for path, data in task.hidden_files.items():
                fresh.write_file(f"{HIDDEN_DIR}/{path}", data)
            # No user site: a usercustomize.py or .pth the agent planted under /work/.local must not run
            # inside the checker (a task that needs installed packages enables it in a child process).
            cmd = "export PYTHONNOUSERSITE=1\n" + (_COMPILE_CHECK if task.check_python else "") + task.verify_command
            r = fresh.exec(["bash", "-c", cmd], timeout=task.verify_timeout_s)
        # the exit status decides; a limit only says why a failed check failed (the sandbox
        # reports none for a check that exits 0, whatever its output says)
        if r.ok:
            return Score(1.0, True, "pass")
        if r.limit_hit in ("wall", "cpu"):
            return Score(0.0, False, "timeout")
        if r.limit_hit:
            return Score(0.0, False, "limit")
        if r.exit_code == 3 and "does not compile:" in r.stdout:
            return Score(0.0, False, "syntax")
        return Score(0.0, False, "fail")

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.sb is not None:
            self.sb.close()
            self.sb = None

    # ---- tools --------------------------------------------------------------------------
    def _obs(self, call: ToolCall, text: str) -> dict:
        msg = {"role": "tool", "content": _clip(text, self.limits.max_observation_chars)}
        if call.id:
            msg["tool_call_id"] = call.id
        if call.name:
            msg["name"] = call.name
        return msg

    def _execute(self, call: ToolCall) -> str:
        if call.error:
            return f"error: {call.error}"
        problem = check_arguments(call)
        if problem:
            return f"error: {problem}"
        a = call.arguments
        return getattr(self, f"_tool_{call.name}")(**a)

    def _read_text(self, path: str) -> str | None:
        host = self.sb.resolve(path)
        if not host.exists():
            return None
        if host.is_dir():
            raise ValueError(f"{path} is a directory; use list_dir")
        return self.sb.read_file(path, limit=self.limits.max_write_bytes * 4).decode("utf-8", "replace")

    def _tool_read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        text = self._read_text(path)
        if text is None:
            return f"error: {path} does not exist; use list_dir to see the files"
        lines = text.splitlines(keepends=True)
        if start_line < 1 or (end_line is not None and end_line < start_line):
            return f"error: lines {start_line}..{end_line} are not a valid range (the file has {len(lines)} lines)"
        return "".join(lines[start_line - 1:end_line]) or "(empty)"

    def _tool_write_file(self, path: str, content: str) -> str:
        size = len(content.encode())
        if size > self.limits.max_write_bytes:
            return f"error: {size} bytes is over the {self.limits.max_write_bytes}-byte limit of one write; write smaller files"
        self.sb.write_file(path, content)
        return f"wrote {size} bytes to {path}"

    def _tool_apply_patch(self, patch: str) -> str:
        try:
            changes = patchlib.apply(patch, self._read_text)
        except patchlib.PatchError as e:
            return f"error: the patch was not applied: {e}"
        for path, text in changes.items():  # all hunks matched: now write every file
            if text is None:
                os.unlink(self.sb.resolve(path))
            else:
                self.sb.write_file(path, text)
        return "patched " + ", ".join(sorted(changes))

    def _tool_list_dir(self, path: str = ".") -> str:
        host = self.sb.resolve(path)
        if not host.is_dir():
            return f"error: {path} is not a directory"
        names = sorted(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in host.iterdir())
        return "\n".join(n for n in names if n != ".git/" or path not in (".", "", "/work")) or "(empty)"

    def _shell(self, command: str, timeout: float) -> str:
        if self.session is None or self.session._proc.poll() is not None:  # the agent ran `exit`: a new shell
            self.session = self.sb.open_session()
        r = self.session.run(command, timeout=timeout)
        parts = []
        if r.stdout:
            parts.append(r.stdout.rstrip("\n"))
        if r.stderr:
            parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
        if r.limit_hit == "wall":
            parts.append(f"[stopped: the command ran past its {timeout:g} s timeout]")
        elif r.limit_hit == "output":
            parts.append("[stopped: the command printed too much output]")
        else:
            if r.truncated:
                parts.append("[output cut at the sandbox's limit]")
            parts.append(f"[exit code {r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)}]")
        return "\n".join(parts)

    def _tool_run(self, command: str, timeout: float | None = None) -> str:
        t = min(self.limits.default_timeout_s, self.limits.max_timeout_s) if timeout is None else float(timeout)
        if not 0 < t <= self.limits.max_timeout_s:
            return f"error: timeout must be in (0, {self.limits.max_timeout_s:g}] seconds"
        return self._shell(command, t)

    def _tool_run_tests(self) -> str:
        if not self.task.test_command:
            return "this task has no visible tests; check your work with `run`"
        return self._shell(self.task.test_command, self.limits.max_timeout_s)

    def _tool_submit(self) -> str:
        self.submitted = True
        return "submitted"
