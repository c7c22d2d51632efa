"""Team workflows as configuration: roles, the order of their turns, budgets, and where a user's
own workflow comes from.

A `Workflow` names its roles (system prompt, the tools each may call, the policy that acts for
it), the order of turns (`sequence`, `round_robin` or a small `graph`) and budgets. All roles
share one env (one sandboxed workspace) and talk through the `message` tool. What is wrong with
a workflow is refused when it is loaded, in one line that names it and the fix: an unknown role
in the order, a tool the family does not have, a graph whose end no turn can reach, a role with
no policy. Running a workflow is `longhaul.agent.team`'s job, not this module's.

Built-in workflows are `coder_tester` and `navigator_driver`; `load_workflow` also takes a YAML
file or `package.module:Name` (a `Workflow`, or a mapping of its fields), resolved as task
families are (`longhaul.envs.registry.load_object`). `solo(wf)` is a team workflow's single-agent
counterpart with the same budgets, the baseline `longhaul team train` compares a team with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import ConfigDict, Field, model_validator

from longhaul.config import Section, validate_config
from longhaul.envs.registry import load_object
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError

END = "end"  # the graph node that ends an episode
MESSAGE = {"type": "function", "function": {
    "name": "message", "description": "Send a message to a teammate and end your turn.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "description": "the teammate's role"},
        "text": {"type": "string"}}, "required": ["to", "text"]}}}
TEAM_TOOLS = {"message": MESSAGE}  # tools the team runner answers itself; the rest go to the env


class Role(Section):
    name: str
    system: str  # the role's instructions; the runner appends its roster, tools and the call format
    tools: list[str]  # a subset of the family env's tools, plus `message`
    policy: str | None = None  # which policy acts for the role: a key of the runner's policies (refused when missing)
    max_turns: int | None = Field(None, ge=1)  # turns of this role per episode; None: only the team's budget
    replies: int = Field(4, ge=1)  # replies per turn; a turn also ends at a submit or a message
    max_new_tokens: int | None = Field(None, ge=1)  # per reply; None: the runner's AgentConfig.max_new_tokens
    # an optional per-role reward: "tests_discriminate" (longhaul.agent.team) or package.module:function
    reward: str | None = None


class Edge(Section):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    src: str = Field(alias="from")
    to: str  # a role, or "end"
    when: Literal["always", "submit", "yield"] = "always"  # yield: the turn ended without a submit


class Order(Section):
    kind: Literal["sequence", "round_robin", "graph"]
    turns: list[str] = []  # sequence: one entry a turn (repeats allowed); round_robin: the cycle
    start: str | None = None  # graph: the first role
    edges: list[Edge] = []  # graph: after a role's turn, the first edge from it whose `when` matches


class Workflow(Section):
    name: str
    description: str = ""
    roles: list[Role]
    order: Order
    max_turns: int = Field(12, ge=1)  # turns of all roles together: every order ends within it
    max_tokens: int | None = Field(None, ge=1)  # completion tokens of all roles together; None: no cap
    turn_timeout_s: float | None = Field(None, gt=0)  # a turn past it (generation and tools) is an infra error

    @model_validator(mode="after")
    def _check(self) -> Workflow:
        names = [r.name for r in self.roles]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup or not names:
            self._refuse(f"role names must be unique and at least one given; fix {dup or 'roles'}")
        for r in self.roles:
            if not r.policy:
                self._refuse(f"role {r.name!r} has no policy; set its policy to the name of the policy that acts for it")
        self._check_order(set(names))
        return self

    def _refuse(self, why: str):
        # not a ValueError: pydantic would wrap it into a multi-line report
        raise LonghaulError(f"workflow {self.name!r}: {why}")

    def _check_order(self, names: set[str]) -> None:
        o = self.order
        used = o.turns if o.kind != "graph" else [o.start or "", *(e.src for e in o.edges),
                                                  *(e.to for e in o.edges if e.to != END)]
        unknown = [n for n in used if n not in names]
        if unknown:
            self._refuse(f"the turn order names unknown role {unknown[0]!r}; use one of {', '.join(sorted(names))}")
        if o.kind != "graph":
            if not o.turns:
                self._refuse(f"a {o.kind} order needs turns: the role names, in order")
            if o.kind == "round_robin" and not any("submit" in self.role(n).tools for n in o.turns):
                self._refuse("a round_robin order ends when a role submits; give one of its roles the submit tool")
            return
        if not o.start:
            self._refuse("a graph order needs start: the role that takes the first turn")
        reach, todo = set(), [o.start]
        while todo:
            n = todo.pop()
            if n not in reach and n != END:
                reach.add(n)
                todo += [e.to for e in o.edges if e.src == n]
        if not any(e.to == END for e in o.edges if e.src in reach):
            self._refuse(f"the turn graph has no end: no edge from a role reachable from {o.start!r} goes to 'end'; "
                             "add one, e.g. {from: ROLE, to: end, when: submit}")
        for n in sorted(reach):
            for outcome in ("submit", "yield"):
                if outcome == "submit" and "submit" not in self.role(n).tools:
                    continue
                if not any(e.src == n and e.when in (outcome, "always") for e in o.edges):
                    self._refuse(f"the turn graph does not say what follows a turn of {n!r} that ends in {outcome}; "
                                     f"add an edge {{from: {n}, when: {outcome}, to: ...}}")

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def check_tools(self, family_tools: list[str], family: str) -> Workflow:
        """Refuse a role tool the family's env does not have (nor the team's own `message`)."""
        have = set(family_tools) | set(TEAM_TOOLS)
        for r in self.roles:
            bad = [t for t in r.tools if t not in have]
            if bad:
                raise LonghaulError(f"workflow {self.name!r}: role {r.name!r} may call {bad[0]!r}, which family {family!r} "
                                    f"does not have; choose from {', '.join(sorted(have))}")
        return self


def workflow_from(obj, where: str) -> Workflow:
    """A Workflow from a Workflow or a mapping of its fields; one line on what is wrong."""
    if isinstance(obj, Workflow):
        obj = obj.model_dump(by_alias=True)  # validated again: a plugin may have built it with model_construct
    if not isinstance(obj, dict):
        raise LonghaulError(f"workflow {where!r} is a {type(obj).__name__}; give a Workflow or a mapping of its fields")
    try:
        return validate_config(obj, Workflow)
    except LonghaulError as e:
        if str(e).startswith("workflow "):  # our own refusals name the workflow already
            raise
        raise LonghaulError(f"workflow {where!r}: {e}") from None


def load_workflow(spec: str, family=None) -> Workflow:
    """A built-in workflow by name, a YAML file, or `package.module:Name`; with a `Family`, its
    roles' tools are checked against the family env's tools."""
    if spec in WORKFLOWS:
        wf = workflow_from(WORKFLOWS[spec], spec)
    elif spec.endswith((".yaml", ".yml")):
        path = Path(spec)
        if not path.is_file():
            raise LonghaulError(f"workflow file {spec!r} not found; pass a YAML file or one of {', '.join(WORKFLOWS)}")
        wf = workflow_from(yaml.safe_load(path.read_text()), spec)
    elif ":" in spec:
        wf = workflow_from(load_object(spec, "workflow"), spec)
    else:
        raise LonghaulError(f"unknown workflow {spec!r}; choose one of {', '.join(WORKFLOWS)}, a YAML file, "
                            "or name your own as package.module:Name")
    return wf if family is None else wf.check_tools(family_tools(family), family.name)


SOLO_ROLE = "agent"
SOLO_SYSTEM = ("You work alone in a Linux workspace at /work. Read the task and the files, change what the task asks, "
               "run the tests, and submit when they pass.")


def solo(wf: Workflow) -> Workflow:
    """A team workflow's single-agent counterpart, the baseline a team is compared with: one role
    with every tool the team's roles have (less `message`: there is nobody to write to), as many
    replies a turn as the team's longest turn, and the team's budgets (turns, completion tokens,
    turn timeout), so both spend at most the same tokens on a task."""
    tools = list(dict.fromkeys(t for r in wf.roles for t in r.tools if t not in TEAM_TOOLS))
    if "submit" not in tools:
        raise LonghaulError(f"workflow {wf.name!r}: no role may submit, so it has no single-agent counterpart; "
                            "give one role the submit tool")
    caps = [r.max_new_tokens for r in wf.roles]
    role = {"name": SOLO_ROLE, "policy": SOLO_ROLE, "tools": tools, "system": SOLO_SYSTEM,
            "replies": max(r.replies for r in wf.roles), "max_new_tokens": None if None in caps else max(caps)}
    return workflow_from({"name": f"{wf.name}_solo", "description": f"one agent in place of {wf.name}'s team",
                          "roles": [role], "order": {"kind": "round_robin", "turns": [SOLO_ROLE]},
                          "max_turns": wf.max_turns, "max_tokens": wf.max_tokens, "turn_timeout_s": wf.turn_timeout_s},
                         f"{wf.name}_solo")


def family_tools(family) -> list[str]:
    """The tool names of a workspace family's env (its `tools()`)."""
    if family.kind != "workspace":
        raise LonghaulError(f"family {family.name!r} is single-turn; a team shares a workspace: choose a workspace family")
    if family.make_env is None:
        env = WorkspaceEnv()
    else:
        env = family.make_env(family.make_split(family.splits[0], 1)[0])
    try:
        return [t["function"]["name"] for t in env.tools()]
    finally:
        env.close()


_READ = ["read_file", "list_dir"]
CODER_TESTER = {
    "name": "coder_tester",
    "description": "The tester writes tests from the task's statement; the coder patches until they and the hidden checks pass.",
    "roles": [
        {"name": "tester", "policy": "tester", "max_turns": 2, "replies": 4, "reward": "tests_discriminate",
         "tools": [*_READ, "write_file", "run", "message"],
         "system": "You are the tester of a two-person team in a Linux workspace at /work. Read the task and the code, "
                   "then write pytest tests in a new file under tests/ that check what the task asks for: they must pass "
                   "once the task is done. Do not change the library code. When the tests are written, message the coder "
                   "where they are."},
        {"name": "coder", "policy": "coder", "replies": 6, "tools": [*_READ, "apply_patch", "write_file", "run", "run_tests",
                                                                      "message", "submit"],
         "system": "You are the coder of a two-person team in a Linux workspace at /work. The tester writes tests for the "
                   "task; change the library code until those tests and the task's own pass, then submit. Do not change "
                   "the tests; if one is wrong, message the tester why."},
    ],
    "order": {"kind": "graph", "start": "tester", "edges": [
        {"from": "tester", "to": "coder"},
        {"from": "coder", "to": "end", "when": "submit"},
        {"from": "coder", "to": "tester", "when": "yield"}]},
    "max_turns": 6,
}
NAVIGATOR_DRIVER = {
    "name": "navigator_driver",
    "description": "The navigator reads and plans with read-only tools; the driver edits, runs and submits.",
    "roles": [
        {"name": "navigator", "policy": "navigator", "replies": 4, "tools": [*_READ, "message"],
         "system": "You are the navigator of a two-person team in a Linux workspace at /work. Read the task and the files "
                   "(you cannot change them), then message the driver a short plan: which file to change and how."},
        {"name": "driver", "policy": "driver", "replies": 6, "tools": [*_READ, "apply_patch", "write_file", "run", "run_tests",
                                                                       "message", "submit"],
         "system": "You are the driver of a two-person team in a Linux workspace at /work. Follow the navigator's plan: "
                   "edit the files, run the tests, and submit when they pass. Message the navigator when you are stuck."},
    ],
    "order": {"kind": "round_robin", "turns": ["navigator", "driver"]},
    "max_turns": 8,
}
WORKFLOWS = {"coder_tester": CODER_TESTER, "navigator_driver": NAVIGATOR_DRIVER}
