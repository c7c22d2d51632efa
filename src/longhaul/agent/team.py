"""Team episodes: the roles of a `Workflow` take turns in one shared env, each through its own
policy, into one token-exact Trajectory per role.

A role's turn is up to `role.replies` replies; it ends early when the role calls `submit` or
sends a `message` (which this module answers; every other call goes to the env, and a call to a
tool the role may not use is refused as an invalid call). Each role keeps its own chat: its system
prompt (instructions, roster, tools), the task, its own replies and their tool outputs, and at the
start of each later turn a user message with what teammates sent it. Its token ids extend turn by
turn exactly as in `agent.loop`, whose helpers build them; a role's trajectory is its own replies
only (mask 1), with everything else as prompt.

The team reward is the env's `verify()`, the same for every role; a role may add its own reward
(`Role.reward`, in `info["role_reward"]`). An episode ends `done` at the order's own end (a
submit, the graph's `end`, the last turn of a sequence), `truncated` when a budget cuts it
(team turns, a role's turns, tokens, context), and `infra_error` when a role's turn breaks the
machinery: its policy raises, the turn runs past `turn_timeout_s`, the policy returns more
tokens than it was allowed, or the env fails. An infra error marks every role's trajectory, so
trainers drop the episode from group baselines; the next episode runs as usual. A policy call
past its timeout is abandoned, not stopped: its thread finishes in the background.
Not here: grouping advantages by role and turn (training), per-role adapters.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from longhaul.agent.loop import (
    AgentConfig,
    Generation,
    Policy,
    _absorb,
    _encode,
    _Episode,
    _finish,
    _next_prompt,
    _record,
    _render,
    _reply_text,
    _room,
    _sampling,
)
from longhaul.agent.role_rewards import role_reward
from longhaul.agent.workflows import END, TEAM_TOOLS, Order, Role, Workflow
from longhaul.envs.base import StepResult
from longhaul.envs.tools import check_arguments, describe, parse_message
from longhaul.envs.workspace import SYSTEM_PROMPT
from longhaul.errors import LonghaulError
from longhaul.types import Trajectory

# the call format and tool list are the workspace env's own words: one text teaches both
TEAM_SYSTEM = ("{system}\nYour team: {roster}. You all work on the same files; you are the {role}.\n"
               + SYSTEM_PROMPT[SYSTEM_PROMPT.index("To use a tool"):])
SOLO_SYSTEM = "{system}\n" + SYSTEM_PROMPT[SYSTEM_PROMPT.index("To use a tool"):]  # a one-role workflow: no team


class _Fault(Exception):
    """A role's turn broke the machinery: the episode is an infra error."""


class _Cut(Exception):
    """A budget ended the episode: it is truncated, and scored."""


@dataclass
class _Member:
    role: Role
    ep: _Episode
    policy: Policy
    turns: int = 0  # turns taken
    inbox: list[tuple[str, str]] = field(default_factory=list)  # (sender, text) not yet shown
    pending: list[int] | None = None  # the last reply's ids, until the next turn's prompt is built on them


@dataclass
class _Team:
    wf: Workflow
    members: dict[str, _Member]
    cfg: AgentConfig
    turns: int = 0
    tokens: int = 0
    submitted: bool = False
    log: list[dict] = field(default_factory=list)  # the messages between roles, in order
    # one entry a turn: the role, where its turn starts in that role's own messages, and how it ended
    turn_log: list[dict] = field(default_factory=list)


def _turn_order(order: Order):
    """The roles in turn, as a generator that is sent each turn's outcome ("submit" or "yield")."""
    if order.kind == "sequence":
        for name in order.turns:
            if (yield name) == "submit":
                return
    elif order.kind == "round_robin":
        while True:
            for name in order.turns:
                if (yield name) == "submit":
                    return
    else:
        name = order.start
        while name != END:
            outcome = yield name
            name = next(e.to for e in order.edges if e.src == name and e.when in (outcome, "always"))


def _generate(m: _Member, cfg: AgentConfig, budget: int, timeout: float | None) -> Generation:
    def call():
        return m.policy.generate([m.ep.ids], _sampling(cfg, budget), [m.ep.key])[0]

    if timeout is None:
        try:
            return call()
        except Exception as e:
            raise _Fault(f"policy: {type(e).__name__}: {e}") from e
    box: dict = {}

    def run():
        try:
            box["out"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["err"] = e
    t = threading.Thread(target=run, daemon=True, name=f"team-policy-{m.ep.key}")
    t.start()
    t.join(max(0.0, timeout))
    if t.is_alive():
        raise _Fault("policy: the turn ran past its timeout while generating")
    if "err" in box:
        raise _Fault(f"policy: {type(box['err']).__name__}: {box['err']}") from box["err"]
    return box["out"]


def _step(team: _Team, m: _Member, reply: str) -> tuple[StepResult, str | None]:
    """Run a reply's calls: `message` here, the role's other tools in the env, the rest refused.
    Returns the merged result and the turn's outcome if the reply ends it ("submit"/"yield")."""
    calls = parse_message(reply)
    allowed = set(m.role.tools)
    ours = [c for c in calls if c.name in TEAM_TOOLS or (not c.error and c.name not in allowed)]
    if not ours:  # the common case: the env reads the reply itself, malformed calls included
        res = m.ep.env.step({"role": "assistant", "content": reply})
        submitted = res.terminated and any(c.name == "submit" and not c.error for c in calls)
        return res, "submit" if submitted else None
    obs, forward, invalid, outcome = [], [], 0, None
    for c in calls:
        if c.error:
            obs.append({"role": "tool", "content": f"error: {c.error}"})
            invalid += 1
        elif c.name not in allowed:
            obs.append({"role": "tool", "name": c.name, "content": f"error: the {m.role.name} may not call {c.name!r}; "
                                                                    f"its tools are {', '.join(m.role.tools)}"})
            invalid += 1
        elif c.name in TEAM_TOOLS:
            text, ok = _message(team, m, c)
            obs.append({"role": "tool", "name": c.name, "content": text})
            invalid += not ok
            outcome = outcome or ("yield" if ok else None)
        else:
            forward.append({"type": "function", "function": {"name": c.name, "arguments": c.arguments}})
    res = StepResult([], 0.0, False, False, {"tool_calls": 0, "invalid_calls": 0, "failed_calls": 0})
    if forward:
        res = m.ep.env.step({"role": "assistant", "content": reply, "tool_calls": forward})
        if res.terminated and any(f["function"]["name"] == "submit" for f in forward):
            outcome = "submit"
    info = {**res.info, "tool_calls": res.info.get("tool_calls", 0) + len(calls) - len(forward),
            "invalid_calls": res.info.get("invalid_calls", 0) + invalid}
    return StepResult(res.observations + obs, res.reward, res.terminated, res.truncated, info), outcome


def _message(team: _Team, m: _Member, call) -> tuple[str, bool]:
    problem = check_arguments(call, TEAM_TOOLS)
    if problem:
        return f"error: {problem}", False
    to, text = call.arguments["to"], call.arguments["text"]
    if to not in team.members or to == m.role.name:
        others = [n for n in team.members if n != m.role.name]
        return f"error: no teammate {to!r}; send to one of {', '.join(others)}", False
    team.members[to].inbox.append((m.role.name, text))
    team.log.append({"from": m.role.name, "to": to, "text": text, "turn": team.turns})
    m.ep.counts["messages_sent"] += 1
    return f"message sent to the {to}", True


def _begin(tok, m: _Member, cfg: AgentConfig) -> None:
    """Show the role what teammates sent it and build the prompt of its turn's first reply."""
    ep = m.ep
    if m.inbox or ep.turns:
        lines = [f"[{sender}] {text}" for sender, text in m.inbox]
        head = "Messages from your team:\n" + "\n".join(lines) + "\n\n" if lines else ""
        again = "It is your turn again; your teammates have worked since your last turn." if ep.turns else "It is your turn."
        ep.messages.append({"role": "user", "content": head + again})
        m.inbox = []
    if m.pending is not None:
        _next_prompt(tok, ep, m.pending, cfg)
        m.pending = None
    else:
        ep.text = _render(tok, ep.messages)
        ep.ids = _encode(tok, ep.text)
    if ep.ended:
        raise _Cut(f"context:{m.role.name}")


def _turn(tok, team: _Team, m: _Member) -> str:
    """One turn of a role; its outcome ("submit" or "yield")."""
    cfg, wf, ep, t0 = team.cfg, team.wf, m.ep, time.perf_counter()
    _begin(tok, m, cfg)
    for k in range(m.role.replies):
        budget = _room(ep, cfg)
        if budget is None:
            raise _Cut(f"context:{m.role.name}")
        budget = min(budget, m.role.max_new_tokens or budget)
        if wf.max_tokens is not None:
            budget = min(budget, wf.max_tokens - team.tokens)
            if budget <= 0:
                raise _Cut("tokens")
        left = None if wf.turn_timeout_s is None else wf.turn_timeout_s - (time.perf_counter() - t0)
        g = _generate(m, cfg, budget, left)
        if len(g.token_ids) > budget:
            raise _Fault(f"policy: returned {len(g.token_ids)} tokens, over the reply's budget of {budget}")
        _record(ep, g)
        team.tokens += len(g.token_ids)
        reply = _reply_text(tok, g.token_ids)
        try:
            res, outcome = _step(team, m, reply)
        except Exception as e:
            raise _Fault(f"step: {type(e).__name__}: {e}") from e
        if not _absorb(ep, reply, res):
            raise _Fault(ep.info.pop("infra_error"))
        if wf.turn_timeout_s is not None and time.perf_counter() - t0 > wf.turn_timeout_s:
            raise _Fault(f"the turn ran past its {wf.turn_timeout_s:g} s timeout")
        if res.truncated and outcome is None:
            raise _Cut(f"env:{m.role.name}")
        if outcome is not None or k == m.role.replies - 1:
            m.pending = g.token_ids
            return outcome or "yield"
        _next_prompt(tok, ep, g.token_ids, cfg)
        if ep.ended:
            raise _Cut(f"context:{m.role.name}")
    raise AssertionError("unreachable: the last reply returns")


def _role_messages(wf: Workflow, role: Role, reset_messages: list[dict], env_tools: list[dict]) -> list[dict]:
    schemas = [t for t in env_tools if t["function"]["name"] in role.tools]
    schemas += [TEAM_TOOLS[n] for n in role.tools if n in TEAM_TOOLS]
    roster = ", ".join(r.name for r in wf.roles)
    text = TEAM_SYSTEM if len(wf.roles) > 1 else SOLO_SYSTEM
    system = text.format(system=role.system, roster=roster, role=role.name, tools=describe(schemas))
    return [{"role": "system", "content": system}, *(dict(x) for x in reset_messages if x.get("role") != "system")]


def run_team_episode(wf: Workflow, policies: dict[str, Policy], tok, env, task, episode: str,
                     cfg: AgentConfig = AgentConfig(), rewards: dict[str, Callable] | None = None) -> list[Trajectory]:
    """One team episode on `task` in `env` (closed here): one Trajectory per role, in role order."""
    members = {r.name: _Member(r, _Episode(f"{episode}:{r.name}", task, env), policies[r.policy]) for r in wf.roles}
    for m in members.values():
        m.ep.counts["messages_sent"] = 0
    team = _Team(wf, members, cfg)
    ended, why, name = "done", None, None
    try:
        try:
            reset_messages, info = env.reset(task)
            env_tools = env.tools()
        except Exception as e:
            raise _Fault(f"reset: {type(e).__name__}: {e}") from e
        for m in members.values():
            m.ep.info = {**info, "role": m.role.name, "episode": episode, "policy": m.role.policy, "workflow": wf.name}
            m.ep.messages = _role_messages(wf, m.role, reset_messages, env_tools)
        order = _turn_order(wf.order)
        name = next(order)
        while True:
            m = members[name]
            if team.turns >= wf.max_turns:
                raise _Cut("max_turns")
            if m.role.max_turns is not None and m.turns >= m.role.max_turns:
                raise _Cut(f"role_turns:{name}")
            m.turns += 1  # counted as it starts: a turn a budget cuts short is still one taken
            team.turns += 1
            team.turn_log.append({"turn": team.turns, "role": name, "first": len(m.ep.messages), "outcome": "unfinished"})
            outcome = _turn(tok, team, m)
            team.turn_log[-1]["outcome"] = outcome
            team.submitted |= outcome == "submit"
            name = order.send(outcome)
    except StopIteration:
        pass
    except _Cut as e:
        ended, why = "truncated", str(e)
    except _Fault as e:
        ended, why = "infra_error", f"role {name}: {e}" if name else str(e)
    return _close_team(team, env, task, ended, why, rewards or {})


def _close_team(team: _Team, env, task, ended: str, why: str | None, rewards: dict) -> list[Trajectory]:
    score, extra = None, {}
    if ended != "infra_error":
        try:
            score = env.verify()
        except Exception as e:
            ended, why = "infra_error", f"verify: {type(e).__name__}: {e}"
    for name, fn in rewards.items():
        if ended == "infra_error":
            break
        try:
            extra[name] = fn(env, task, name)
        except Exception as e:  # the hook's failure is ours: the team's reward stands
            extra[name] = None
            team.members[name].ep.info["role_reward_error"] = f"{type(e).__name__}: {e}"
    try:
        env.close()
    except Exception:
        pass
    out = []
    for name, m in team.members.items():
        m.ep.ended = ended
        if ended == "truncated":
            m.ep.info["truncated_by"] = why
        elif ended == "infra_error":
            m.ep.info["infra_error"] = why
        t = _finish(m.ep, team.cfg, score)
        t.info.update(submitted=team.submitted, role_turns=m.turns, team_turns=team.turns, team_tokens=team.tokens,
                      team_messages=[dict(x) for x in team.log], team_turn_log=[dict(x) for x in team.turn_log],
                      tokens=t.completion_len)
        if name in extra:
            t.info["role_reward"] = extra[name]
        out.append(t)
    return out


def run_team(wf: Workflow, policies: dict[str, Policy], tok, make_env: Callable, tasks: list,
             cfg: AgentConfig = AgentConfig(), episodes: list[str] | None = None, groups: list[int] | None = None,
             workers: int = 1, on_done: Callable | None = None) -> list[list[Trajectory]]:
    """One team episode per task (repeat a task for a group): per episode, one Trajectory per role
    (role order); `groups` sets Trajectory.group (default the task's index). Episodes run `workers` at a time where every policy takes
    concurrent calls; `on_done(trajectories)` after each."""
    missing = sorted({r.policy for r in wf.roles} - set(policies))
    if missing:
        raise LonghaulError(f"workflow {wf.name!r} needs policies {', '.join(missing)}; pass one for each role's policy name")
    rewards = {r.name: role_reward(r.reward) for r in wf.roles if r.reward}
    episodes = episodes or [f"{wf.name}/{i}/{t.task_id}" for i, t in enumerate(tasks)]

    def one(i: int) -> list[Trajectory]:
        trajs = run_team_episode(wf, policies, tok, make_env(tasks[i]), tasks[i], episodes[i], cfg, rewards)
        for t in trajs:
            t.group = groups[i] if groups else i
        if on_done:
            on_done(trajs)
        return trajs

    parallel = workers > 1 and all(getattr(p, "concurrent", False) for p in policies.values())
    if not parallel:
        return [one(i) for i in range(len(tasks))]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(tasks))))
