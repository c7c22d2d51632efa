"""Verified multi-role demonstrations: a team's cold start, one SFT row per role and episode.

Each train task's reference solution (`demos.scripts_for`, any of its variants) is split into the
parts a workflow's roles play, replayed through the real team runner and sandbox by the scripted
policy, and kept only when the hidden checks (`verify()`) pass and every per-role reward the
workflow defines (e.g. the tester's `tests_discriminate`) is not 0. Which part a role plays is read
from its tools, so a user's workflow gets demonstrations too:
- the **actor**, the first role that may `submit`: the reference calls (in its tools), a run of a
  teammate's tests where one wrote them, then submit. Read-only replies are dropped first when
  the script is longer than the role's `replies`;
- a **tester**, a role that may `write_file` but not submit: reads the test the task names (or
  the file the reference writes), writes a test from it under `tests/` (one that fails as given
  and passes once the task is done), and messages the actor where it is;
- a **reader**, any other role: lists the workdir, reads the files the reference touches, and
  messages the actor a plan drawn from the reference (which file, which line, what to run).

A row is the role's own chat (its system prompt with its roster and tools, the task, its replies,
their tool outputs, and the team's messages as it saw them), ending on its last reply, with the
workflow, role, policy and episode, so each role's policy can be SFT'd on its own turns. Rows come
from the train split only. Not here: the SFT itself (`runtime.team_train`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Callable

from longhaul.agent.demos import _observation_after, _patched_paths, scripts_for, touched, validate
from longhaul.agent.loop import AgentConfig, ScriptedPolicy
from longhaul.agent.team import run_team
from longhaul.agent.workflows import Role, Workflow, load_workflow
from longhaul.envs.tools import format_call, parse_message
from longhaul.envs.workspace import WorkspaceEnv, failed_output
from longhaul.errors import LonghaulError
from longhaul.models.byte_tokenizer import byte_tokenizer

READ_ONLY = {"read_file", "list_dir", "run_tests"}


def team_test(task) -> tuple[str, str] | None:
    """(path, text) of a test a tester can write from the task: the test file its statement names,
    else one asserting the content of each file the reference writes; None where neither exists."""
    path = next(f"tests/test_team{k or ''}.py" for k in range(100) if f"tests/test_team{k or ''}.py" not in task.files)
    for name in re.findall(r"tests/[\w/.-]+\.py", task.instruction):
        if isinstance(task.files.get(name), str):
            return path, task.files[name]
    writes = [a.args for a in task.reference if a.tool == "write_file" and isinstance(a.args.get("content"), str)
              and not posixpath.basename(a.args["path"]).startswith("test_")]
    if not writes:
        return None
    checks = []
    for w in writes:
        name, want = re.sub(r"\W", "_", w["path"]), w["content"].strip()
        checks.append(f"def test_{name}():\n    assert Path({w['path']!r}).read_text().strip() == {want!r}\n")
    return path, "from pathlib import Path\n\n\n" + "\n\n".join(checks)


def plan(task) -> str:
    """A navigator's plan from the reference: what to change where, and what to run."""
    steps = []
    for a in task.reference:
        if a.tool == "apply_patch":
            lines = a.args["patch"].splitlines()
            old = next((x[1:].strip() for x in lines if x.startswith("-") and not x.startswith("---") and x[1:].strip()), "")
            new = next((x[1:].strip() for x in lines if x.startswith("+") and not x.startswith("+++") and x[1:].strip()), "")
            where = ", ".join(_patched_paths(a.args["patch"])) or "the file"
            steps.append(f"in {where}, change `{old}` to `{new}`" if old else f"patch {where} to add `{new}`")
        elif a.tool == "write_file":
            content = a.args.get("content", "")
            steps.append(f"write {a.args['path']} with {content[:200]!r}" if isinstance(content, str) else f"write {a.args['path']}")
        elif a.tool == "run":
            steps.append(f"run `{a.args['command']}`")
    body = "; ".join(f"{i}. {s}" for i, s in enumerate(steps, 1)) or "1. the reference needs no change"
    return f"Plan: {body}. Then check the result and submit."


def _only_reads(reply: str) -> bool:
    calls = parse_message(reply)
    return bool(calls) and all(c.name in READ_ONLY for c in calls) and reply.lstrip().startswith("<tool_call>")


def _actor(role: Role, task, variant: str, seed: int, custom, test: str | None) -> tuple[list[str], int | None, str | None] | None:
    got = scripts_for(task, variant, seed, custom)
    if got is None:
        return None
    replies, wrong, strategy = got
    if any(c.name not in role.tools for r in replies for c in parse_message(r)):
        return None  # the reference needs a tool this role lacks: some other split of the work
    if test is not None and "run" in role.tools:
        replies = replies[:-1] + [format_call("run", command=f"python3 -m pytest -q {test}"), replies[-1]]
    while len(replies) > role.replies:  # too long for one turn: drop pure reads, never the last check
        k = next((k for k, r in enumerate(replies[:-2]) if _only_reads(r) and k != wrong), None)
        if k is None:
            break
        replies = replies[:k] + replies[k + 1:]
        wrong = None if wrong is None else wrong - (k < wrong)
    return replies, wrong, strategy


def role_scripts(wf: Workflow, task, variant: str = "reference", seed: int = 0,
                 custom: Callable | None = None) -> tuple[dict[str, list[str]], int | None, str | None] | None:
    """Per-role replies (by role name) of one team demonstration, the index of the actor's reply
    that must fail (a repair; else None) and the strategy; None where this workflow cannot split
    the task's reference (no role may submit, a tester with no test to write)."""
    actor = next((r for r in wf.roles if "submit" in r.tools), None)
    if actor is None or not getattr(task, "reference", None):
        return None
    testers = [r for r in wf.roles if r is not actor and "write_file" in r.tools]
    test = team_test(task) if testers else None
    if testers and test is None:
        return None
    got = _actor(actor, task, variant, seed, custom, test and test[0])
    if got is None:
        return None
    scripts = {actor.name: got[0]}
    tell = (lambda text: [format_call("message", to=actor.name, text=text)])
    for r in wf.roles:
        if r is actor:
            continue
        if r in testers:
            source = next((n for n in re.findall(r"tests/[\w/.-]+\.py", task.instruction) if n in task.files), None)
            look = [format_call("read_file", path=source) if source and "read_file" in r.tools else format_call("list_dir")]
            note = f"I wrote {test[0]}; run it with `python3 -m pytest -q {test[0]}` and make it pass."
            scripts[r.name] = look + [format_call("write_file", path=test[0], content=test[1])] + (
                tell(note) if "message" in r.tools else [])
        elif "message" in r.tools:
            looks = [format_call("list_dir")] * ("list_dir" in r.tools)
            looks += [format_call("read_file", path=p) for p in touched(task) if "read_file" in r.tools]
            scripts[r.name] = looks[:max(0, r.replies - 1)] + tell(plan(task))
        else:
            scripts[r.name] = [format_call("list_dir") if "list_dir" in r.tools else got[0][0]]
    return scripts, got[1], got[2]


def build_team_demos(family, workflow: str | Workflow, n: int, difficulty: int = 1, variants: tuple[str, ...] = ("reference",),
                     seed: int = 0, workers: int = 2, on_done: Callable | None = None, split: str = "train",
                     subfamilies: list[str] | None = None) -> list[dict]:
    """Verified per-role demonstration rows of `workflow` from `n` tasks of the family's train split,
    one episode per task and variant that the workflow can split; `on_done` once per episode."""
    validate(family, variants, split)
    wf = workflow if isinstance(workflow, Workflow) else load_workflow(workflow, family)
    tasks = family.make_split("train", n, difficulty, subfamilies)
    if not any(getattr(t, "reference", None) for t in tasks):
        raise LonghaulError(f"family {family.name!r} has no oracle: its tasks carry no reference tool calls "
                            "(WorkspaceTask.reference); demonstrations replay them")
    eps, meta, scripts = [], [], {}
    for t in tasks:
        for v in variants:
            got = role_scripts(wf, t, v, seed, family.demo_scripts)
            if got is None:
                continue
            episode = f"{wf.name}/{v}/{t.task_id}"
            scripts.update({f"{episode}:{role}": replies for role, replies in got[0].items()})
            eps.append(t)
            meta.append((episode, v, got))
    if not eps:
        raise LonghaulError(f"workflow {wf.name!r} cannot split any reference of family {family.name!r}: it needs a role "
                            "that may submit (and, for a tester, a task that names a test or writes a file); try another family")
    tok = byte_tokenizer()
    cfg = AgentConfig(max_tokens=10_000_000, max_new_tokens=1 << 16, keep_messages=True)
    policy = ScriptedPolicy(tok, scripts)
    results = run_team(wf, {r.policy: policy for r in wf.roles}, tok, family.make_env or (lambda task: WorkspaceEnv()), eps,
                       cfg, episodes=[m[0] for m in meta], workers=workers, on_done=on_done)
    rows = []
    for t, (episode, variant, (per_role, wrong, strategy)), trajs in zip(eps, meta, results):
        if not _verified(trajs, per_role, wrong, wf):
            continue
        for traj in trajs:
            msgs = list(traj.info.get("messages") or [])
            while msgs and msgs[-1]["role"] != "assistant":
                msgs.pop()  # end on the role's last reply
            if not msgs:
                continue  # the episode ended before this role's first turn
            rows.append({"messages": msgs, "family": t.family, "subfamily": getattr(t, "subfamily", None) or t.family,
                         "task_id": t.task_id, "workflow": wf.name, "role": traj.info["role"], "policy": traj.info["policy"],
                         "episode": episode, "variant": variant, "strategy": strategy, "repair": wrong is not None,
                         "turns": sum(m["role"] == "assistant" for m in msgs), "role_reward": traj.info.get("role_reward")})
    return rows


def _verified(trajs, per_role: dict[str, list[str]], wrong: int | None, wf: Workflow) -> bool:
    """Passed, every role ran its script to the end (or never got a turn), no role reward is 0, and
    a repair's wrong attempt really failed."""
    if not trajs or not trajs[0].info.get("passed") or trajs[0].info["ended"] != "done":
        return False
    actor = next(r.name for r in wf.roles if "submit" in r.tools)
    for traj in trajs:
        role = traj.info["role"]
        if traj.info.get("role_reward") == 0.0 or len(traj.turns) not in (0, len(per_role[role])):
            return False
        if role == actor and wrong is not None and not failed_output(_observation_after(traj.info.get("messages") or [], wrong)):
            return False
    return True
