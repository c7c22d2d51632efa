"""`longhaul team run` as a library call: a family's tasks through a workflow, every role acted by
a scripted oracle or one shared model, per-role trajectories written to a JSONL file, and the
per-role summary the command prints.

The scripted oracle checks the machinery, not the team: the first role that may submit replays
the task's reference solution (the calls it may make) and submits; every other role messages it,
or makes one read-only reference call where it has no `message`. Training a team is not here.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

from longhaul.agent.loop import AgentConfig, ModelPolicy, ScriptedPolicy
from longhaul.agent.team import run_team
from longhaul.agent.workflows import Workflow, load_workflow
from longhaul.envs.datasets import write_jsonl
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.inference import context_length
from longhaul.models import load_policy
from longhaul.models.byte_tokenizer import byte_tokenizer
from longhaul.types import Trajectory


def oracle_scripts(wf: Workflow, task, episode: str) -> dict[str, list[str]]:
    """Per-role scripts (keyed `episode:role`, as `run_team` keys policies) that solve `task`
    through its reference, where the task has one and some role may submit."""
    reference = list(getattr(task, "reference", ()) or ())
    if not reference:
        raise LonghaulError(f"task {task.task_id} has no reference solution; the scripted policy needs one (or pass a model)")
    closer = next((r for r in wf.roles if "submit" in r.tools), None)
    if closer is None:
        raise LonghaulError(f"workflow {wf.name!r} has no role that may submit; the scripted policy replays the reference "
                            "and submits")
    scripts = {}
    for role in wf.roles:
        if role is closer:
            steps = [a.text() for a in reference if a.tool in role.tools] + [format_call("submit")]
        elif "message" in role.tools:
            steps = [format_call("message", to=closer.name, text="Your turn: solve the task and submit.")]
        else:
            steps = [next((a.text() for a in reference if a.tool in role.tools), format_call("list_dir"))]
        scripts[f"{episode}:{role.name}"] = steps
    return scripts


def summarize(episodes: list[list[Trajectory]]) -> dict:
    """Per-role totals (replies, turns, tokens, invalid calls, messages) and the team's pass rate
    over the episodes that were not infra errors."""
    roles: dict[str, dict] = defaultdict(lambda: {"episodes": 0, "replies": 0, "turns": 0, "tokens": 0,
                                                  "invalid_calls": 0, "messages_sent": 0})
    for trajs in episodes:
        for t in trajs:
            r = roles[t.info["role"]]
            r["episodes"] += 1
            r["replies"] += len(t.turns)
            r["turns"] += t.info.get("role_turns", 0)
            r["tokens"] += t.completion_len
            r["invalid_calls"] += t.info.get("invalid_calls", 0)
            r["messages_sent"] += t.info.get("messages_sent", 0)
    scored = [e for e in episodes if e and e[0].info["ended"] != "infra_error"]
    passed = sum(bool(e[0].info.get("passed")) for e in scored)
    return {"episodes": len(episodes), "infra_errors": len(episodes) - len(scored), "passed": passed,
            "pass_rate": passed / len(scored) if scored else 0.0,
            "truncated": sum(e[0].info["ended"] == "truncated" for e in scored), "roles": dict(roles)}


def run_workflow(workflow: str, family, n: int, policy: str, out: str | Path, split: str = "train", difficulty: int = 1,
                 model: str | None = None, max_new_tokens: int = 256, temperature: float = 1.0, seed: int = 0,
                 progress_factory: Callable | None = None) -> dict:
    """Run `n` team episodes of `family`'s `split`; write every role's trajectory to `out` (one
    JSON object a line, written whole or not at all); return `summarize`'s dict with `out`.
    `progress_factory(name, total)` is a context manager giving `advance(k)`, entered once the
    workflow, tasks and policies are ready."""
    wf = load_workflow(workflow, family)
    if split not in family.splits:
        raise LonghaulError(f"family {family.name!r} has no split {split!r}; choose one of {', '.join(family.splits)}")
    tasks = family.make_split(split, n, difficulty)
    episodes = [f"{wf.name}/{seed}/{i}/{t.task_id}" for i, t in enumerate(tasks)]
    names = sorted({r.policy for r in wf.roles})
    if policy == "scripted":
        if model:
            tok = load_policy(model)[1]
        else:
            tok = byte_tokenizer()
        scripts = {k: v for e, t in zip(episodes, tasks) for k, v in oracle_scripts(wf, t, e).items()}
        shared = ScriptedPolicy(tok, scripts)
        cfg = AgentConfig(max_tokens=1 << 20, max_new_tokens=1 << 16)  # an oracle's replies are whatever its script says
    else:
        net, tok = load_policy(policy)
        shared = ModelPolicy(net, tok, seed=seed)
        cfg = AgentConfig(max_tokens=context_length(net), max_new_tokens=max_new_tokens, temperature=temperature)
    make_env = family.make_env or (lambda t: WorkspaceEnv())
    policies = {name: shared for name in names}
    with progress_factory(wf.name, len(tasks)) if progress_factory else nullcontext(lambda k: None) as advance:
        results = run_team(wf, policies, tok, make_env, tasks, cfg, episodes=episodes, on_done=lambda trajs: advance(1))
    path = write_jsonl([t.to_dict() for trajs in results for t in trajs], out)
    return {**summarize(results), "workflow": wf.name, "family": family.name, "out": str(path)}
