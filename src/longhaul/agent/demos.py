"""Verified multi-turn demonstrations from a workspace family's oracle: a cold start for agents.

Each task's reference tool calls (`WorkspaceTask.reference`) are varied into episodes that read
like real work, replayed through the real agent loop and sandbox by a scripted policy, and kept
only when the hidden checks (`verify()`) pass:
- `reference`: the oracle's calls, then submit;
- `explore`: look before acting (list the workdir, read the files the reference touches, run the
  visible tests) in a seeded order, act, check the result, submit;
- `repair`: a plausible wrong first attempt, the real error it produces, a short note and the
  fix. Strategies, each used where the reference allows it:
  * `bad_context`: a patch whose context does not match the file (the env refuses it), then
    read the file, then the right patch;
  * `wrong_edit`: a patch that changes the wrong line of the file the reference fixes (one
    mutation of the buggy code), the tests still failing, then a patch from there to the fix;
  * `bad_path`: a command or read with a mistyped path (it fails), a look at the directory,
    then the right call;
  * `bad_command`: a shell command whose program name has a typo (exit 127), then the command.
  A repair row is kept only if the wrong attempt's observation really reports a failure.

Rows are chat messages (`system`, `user`, then `assistant` tool calls and `tool` results) with
the family, sub-family, task id, variant and whether the episode contains a repair; the last
message is the assistant's submit. Rows come from the train split only: held-out tasks never
appear. Works for any workspace family with references, built-in or a plugin.
"""

from __future__ import annotations

import posixpath
import random
import re
from typing import Callable

from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
from longhaul.envs import patch as patchlib
from longhaul.envs.mutate import enumerate_mutants
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv, failed_output
from longhaul.errors import LonghaulError
from longhaul.models.byte_tokenizer import byte_tokenizer

VARIANTS = ("reference", "explore", "repair")
NOTES = {  # the note before the repairing call, by strategy
    "bad_context": ("The patch did not apply: its lines do not match the file. I will read the file and patch it again.",
                    "That patch failed to apply. Let me read the file to get the exact lines."),
    "wrong_edit": ("The tests still fail, so that edit was wrong. I will look at the file again and fix the real bug.",
                   "Still failing: I changed the wrong line. Let me re-read the code and fix it properly."),
    "bad_path": ("That path does not exist. Let me list the directory to find the right name.",
                 "The file was not found; I will check the directory listing."),
    "bad_command": ("The command name was mistyped. Running it again, spelled right.",
                    "That command does not exist: a typo. Fixing it."),
}


def _call(tool: str, **args) -> str:
    return format_call(tool, **args)


def _patched_paths(patch: str) -> list[str]:
    try:
        return [fp.new or fp.old for fp in patchlib.parse(patch)]
    except patchlib.PatchError:
        return []


def touched(task) -> list[str]:
    """Files of the workdir that the reference reads, patches or overwrites, in order."""
    out = []
    for a in task.reference:
        paths = [a.args["path"]] if "path" in a.args else _patched_paths(a.args.get("patch", ""))
        out += [p for p in paths if p in task.files and p not in out]
    return out


def _explore(task, rng: random.Random) -> list[str]:
    looks = [_call("list_dir")] + [_call("read_file", path=p) for p in touched(task)[:2]]
    if task.test_command:
        looks.append(_call("run_tests"))
    rng.shuffle(looks)
    act = [a.text() for a in task.reference if a.text() not in looks]
    check = _call("run_tests") if task.test_command else _call("list_dir")
    return looks + act + [check]


def _misspell(name: str, rng: random.Random) -> str:
    stem, ext = posixpath.splitext(posixpath.basename(name))
    if len(stem) < 3:
        wrong = stem + "s"
    else:
        k = rng.randrange(1, len(stem) - 1)
        wrong = stem[:k] + stem[k + 1:]  # a dropped letter
    return posixpath.join(posixpath.dirname(name), wrong + ext)


def _bad_path(task, rng: random.Random) -> tuple[list[str], int] | None:
    """The first call that names a workdir file, first with the file's name misspelt."""
    ref = list(task.reference)
    for k, a in enumerate(ref):
        path = a.args.get("path") if a.tool == "read_file" else None
        if path in task.files:
            wrong = _call("read_file", path=_misspell(path, rng))
        elif a.tool == "run":
            names = [p for p in task.files if re.search(rf"(?<![\w./-]){re.escape(p)}(?![\w.-])", a.args["command"])]
            if not names:
                continue
            bad = _misspell(names[0], rng)
            if bad in task.files:
                continue
            wrong = _call("run", command=re.sub(rf"(?<![\w./-]){re.escape(names[0])}(?![\w.-])", bad, a.args["command"], count=1))
        else:
            continue
        folder = posixpath.dirname(path or names[0]) or "."
        fix = f"{rng.choice(NOTES['bad_path'])}\n{_call('list_dir', path=folder)}"
        return [x.text() for x in ref[:k]] + [wrong, fix] + [x.text() for x in ref[k:]], k
    return None


def _patch_step(task):
    """(index, path, buggy text, fixed text) of the reference's first single-file patch of a text file."""
    for k, a in enumerate(task.reference):
        if a.tool != "apply_patch":
            continue
        paths = _patched_paths(a.args["patch"])
        if len(paths) != 1 or not isinstance(task.files.get(paths[0]), str):
            continue
        try:
            fixed = patchlib.apply(a.args["patch"], lambda p: task.files.get(p) if isinstance(task.files.get(p), str) else None)
        except patchlib.PatchError:
            continue
        if fixed.get(paths[0]) is not None:
            return k, paths[0], task.files[paths[0]], fixed[paths[0]]
    return None


def _bad_context(task, rng: random.Random) -> tuple[list[str], int] | None:
    found = _patch_step(task)
    if found is None:
        return None
    k, path, _, _ = found
    patch = task.reference[k].args["patch"]
    lines = patch.splitlines()
    removed = [i for i, x in enumerate(lines) if x.startswith("-") and not x.startswith("---") and x[1:].strip()]
    if not removed:
        return None
    i = removed[0]
    body = lines[i][1:]
    lines[i] = "-" + (body.lstrip() if body != body.lstrip() else "    " + body)  # the indentation a model gets wrong
    wrong = _call("apply_patch", patch="\n".join(lines) + "\n")
    fix = f"{rng.choice(NOTES['bad_context'])}\n{_call('read_file', path=path)}"
    ref = [a.text() for a in task.reference]
    return ref[:k] + [wrong, fix] + ref[k:], k


def _wrong_edit(task, rng: random.Random) -> tuple[list[str], int] | None:
    found = _patch_step(task)
    if found is None or not task.test_command or not found[1].endswith(".py"):
        return None
    k, path, buggy, fixed = found
    try:
        mutants = enumerate_mutants(path, buggy)
    except SyntaxError:
        return None
    changed = {i for i, (a, b) in enumerate(zip(buggy.splitlines(), fixed.splitlines())) if a != b}
    mutants = [m for m in mutants if m.line - 1 not in changed]
    if not mutants:
        return None
    wrong_text = rng.choice(mutants).apply(buggy)
    wrong = _call("apply_patch", patch=patchlib.make(path, buggy, wrong_text))
    note = f"{rng.choice(NOTES['wrong_edit'])}\n{_call('read_file', path=path)}"
    ref = [a.text() for a in task.reference]
    rest = [_call("apply_patch", patch=patchlib.make(path, wrong_text, fixed))] + ref[k + 1:]
    if not any("run_tests" in r for r in rest):
        rest.append(_call("run_tests"))
    return ref[:k] + [wrong, _call("run_tests"), note] + rest, k + 1


def _bad_command(task, rng: random.Random) -> tuple[list[str], int] | None:
    """The first shell command with its program name mistyped (the shell answers 127)."""
    ref = list(task.reference)
    for k, a in enumerate(ref):
        m = re.match(r"\s*([A-Za-z][\w.+-]{2,})(?=\s|$)", a.args.get("command", "")) if a.tool == "run" else None
        if m is None:
            continue
        prog = m.group(1)
        i = rng.randrange(len(prog) - 1)
        typo = prog[:i] + prog[i + 1] + prog[i] + prog[i + 2:] if prog[i] != prog[i + 1] else prog + prog[-1]
        wrong = _call("run", command=a.args["command"][:m.start(1)] + typo + a.args["command"][m.end(1):])
        fix = f"{rng.choice(NOTES['bad_command'])}\n{a.text()}"
        return [x.text() for x in ref[:k]] + [wrong, fix] + [x.text() for x in ref[k + 1:]], k
    return None


STRATEGIES: dict[str, Callable] = {"bad_context": _bad_context, "wrong_edit": _wrong_edit, "bad_path": _bad_path,
                                   "bad_command": _bad_command}


def scripts_for(task, variant: str, seed: int = 0, custom: Callable | None = None) -> tuple[list[str], int | None, str | None] | None:
    """The replies of one demonstration (submit last), the index of the reply whose result must
    report a failure (repairs; else None) and the strategy; None where the variant does not apply.
    `custom(task, variant, rng)` (a family's `demo_scripts`) writes them in the family's own tools."""
    rng = random.Random(f"{task.task_id}:{variant}:{seed}")
    if variant not in VARIANTS:
        raise LonghaulError(f"unknown demonstration variant {variant!r}; use {', '.join(VARIANTS)}")
    if custom is not None:
        return custom(task, variant, rng)
    if variant == "reference":
        return [a.text() for a in task.reference] + [_call("submit")], None, None
    if variant == "explore":
        return _explore(task, rng) + [_call("submit")], None, None
    if variant != "repair":
        raise LonghaulError(f"unknown demonstration variant {variant!r}; use {', '.join(VARIANTS)}")
    names = list(STRATEGIES)
    rng.shuffle(names)
    for name in names:
        got = STRATEGIES[name](task, rng)
        if got is not None:
            replies, wrong = got
            return replies + [_call("submit")], wrong, name
    return None


def _observation_after(messages: list[dict], reply: int) -> str:
    """The first observation that answered the `reply`-th assistant message."""
    seen = -1
    for k, m in enumerate(messages):
        if m["role"] == "assistant":
            seen += 1
            if seen == reply:
                return next((x["content"] for x in messages[k + 1:] if x["role"] in ("tool", "user")), "")
    return ""


def validate(family, variants: tuple[str, ...], split: str = "train") -> None:
    """One-line errors for a request `build_demos` cannot serve (checked before any work starts)."""
    if family.kind != "workspace":
        raise LonghaulError(f"family {family.name!r} is single-turn; multi-turn demonstrations need a workspace family")
    if split != "train":
        raise LonghaulError("demonstrations come from the train split only (held-out tasks are for evaluation); drop --split")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise LonghaulError(f"unknown demonstration variant {(unknown or [''])[0]!r}; use {', '.join(VARIANTS)}")


def build_demos(family, n: int, difficulty: int = 1, variants: tuple[str, ...] = VARIANTS, seed: int = 0,
                workers: int = 2, on_done: Callable | None = None, split: str = "train",
                subfamilies: list[str] | None = None) -> list[dict]:
    """Verified demonstration rows from `n` tasks of the family's train split (of `subfamilies`
    only, when given), one per variant that applies to a task; `on_done` is called once per
    finished episode."""
    validate(family, variants, split)
    tasks = family.make_split("train", n, difficulty, subfamilies)
    if not tasks:
        raise LonghaulError(f"family {family.name!r} made no train tasks; raise --n")
    if not any(getattr(t, "reference", None) for t in tasks):
        raise LonghaulError(f"family {family.name!r} has no oracle: its tasks carry no reference tool calls "
                            "(WorkspaceTask.reference); demonstrations replay them")
    eps, meta, scripts = [], [], {}
    for t in tasks:
        if not getattr(t, "reference", None):
            continue
        for v in variants:
            got = scripts_for(t, v, seed, family.demo_scripts)
            if got is None:
                continue
            key = f"{v}:{t.task_id}"
            scripts[key] = got[0]
            eps.append(t)
            meta.append((key, v, got[1], got[2]))

    tok = byte_tokenizer()
    longest = max(len(s) for s in scripts.values())
    cfg = AgentConfig(max_turns=longest + 1, max_tokens=10_000_000, workers=workers, keep_messages=True, max_live=8 * workers)
    make_env = family.make_env or (lambda task: WorkspaceEnv())
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, make_env, eps, cfg, keys=[m[0] for m in meta], on_done=on_done)
    rows = []
    for t, (key, variant, wrong, strategy), traj in zip(eps, meta, trajs):
        msgs = traj.info.get("messages") or []
        if not traj.info.get("passed") or len(scripts[key]) != traj.info["turns"]:
            continue  # unverified, or the script did not run to its submit
        if wrong is not None and not failed_output(_observation_after(msgs, wrong)):
            continue  # the wrong attempt did not fail: not a repair
        while msgs and msgs[-1]["role"] != "assistant":
            msgs = msgs[:-1]  # end on the submit
        rows.append({"messages": msgs, "family": t.family, "subfamily": getattr(t, "subfamily", None) or t.family,
                     "task_id": t.task_id, "variant": variant, "strategy": strategy, "repair": wrong is not None,
                     "turns": sum(m["role"] == "assistant" for m in msgs)})
    return rows
