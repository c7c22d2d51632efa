"""Real team episodes for tests that read them: a scripted tester and coder on a bugfix task in
the real sandbox, the coder fixing the bug or submitting it as it is."""

from functools import lru_cache

from longhaul.agent.loop import AgentConfig, ScriptedPolicy
from longhaul.agent.team import run_team
from longhaul.agent.workflows import load_workflow
from longhaul.envs.registry import get_family
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.models.byte_tokenizer import byte_tokenizer

CFG = AgentConfig(max_tokens=100_000, max_new_tokens=4096, keep_messages=True)


@lru_cache(maxsize=None)
def coder_tester_episode(key: str, fix: bool):
    """(task, [[tester, coder]]): one episode keyed `key`; the coder patches, runs the tests and
    submits when `fix`, else submits at once. Run once a suite (readers must not change them)."""
    tok, bugfix = byte_tokenizer(), get_family("bugfix")
    task = bugfix.make_split("train", 1)[0]
    wf = load_workflow("coder_tester", bugfix)
    patch = next(a for a in task.reference if a.tool == "apply_patch")
    tester = [format_call("write_file", path="tests/test_team.py", content=task.files["tests/test_issue.py"]),
              format_call("message", to="coder", text="tests/test_team.py checks merge.")]
    coder = [patch.text(), format_call("run_tests"), format_call("submit")] if fix else [format_call("submit")]
    pol = ScriptedPolicy(tok, {f"{key}:tester": tester, f"{key}:coder": coder})
    return task, run_team(wf, {"tester": pol, "coder": pol}, tok, lambda t: WorkspaceEnv(), [task], CFG, episodes=[key])
