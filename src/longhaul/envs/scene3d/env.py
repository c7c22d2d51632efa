"""The scene3d environment: the agent edits a scene world through ECS tools; `verify()` exports
the world and checks it in a headless browser.

`SceneEnv` implements the Env protocol (`longhaul.envs.base`). There is no sandbox: the tools
only change the in-memory `World`, and model output never raises (a bad call comes back as an
`error: ...` observation naming the fix). The task's checks are run only in `verify()`.
"""

from __future__ import annotations

import json

from longhaul.envs.base import StepResult
from longhaul.envs.scene3d import assets, docs
from longhaul.envs.scene3d.browser import BrowserPool
from longhaul.envs.scene3d.verify import Report, verify_world
from longhaul.envs.scene3d.world import COMPONENTS, SCHEMAS, World
from longhaul.envs.tools import _fn, check_arguments, describe, parse_message
from longhaul.errors import LonghaulError
from longhaul.types import Score

_ENTITY = {"type": "string", "description": "the entity's name"}
TOOLS = {
    "create_entity": _fn("create_entity", "Create an empty named entity (optionally the child of another).",
                         {"entity": _ENTITY, "parent": {"type": "string", "description": "the parent entity's name"}}, ("entity",)),
    "set_component": _fn("set_component", "Add or update a component of an entity; fields you leave out keep their value. "
                         "Components and fields: " + "; ".join(f"{c}({', '.join(f)})" for c, f in SCHEMAS.items()) +
                         ". Positions are [x, y, z] (y is up, the camera usually looks along -z), rotations in degrees, "
                         "colours like \"#ff8800\". search_docs explains each component and field.",
                         {"entity": _ENTITY, "component": {"type": "string", "enum": list(COMPONENTS)},
                          "values": {"type": "object", "description": "field -> value"}}, ("entity", "component", "values")),
    "remove_component": _fn("remove_component", "Remove a component from an entity.",
                            {"entity": _ENTITY, "component": {"type": "string", "enum": list(COMPONENTS)}}, ("entity", "component")),
    "remove_entity": _fn("remove_entity", "Remove an entity and its children.", {"entity": _ENTITY}, ("entity",)),
    "list_entities": _fn("list_entities", "Show every entity of the scene with its components."),
    "search_assets": _fn("search_assets", "Find prefabs in the asset library (trees, lamps, furniture, buildings, ...) by words; "
                         "show one with the asset component {\"name\": ID}.", {"query": {"type": "string"}}, ("query",)),
    "search_docs": _fn("search_docs", "Search the documentation of the scene's components and of the Three.js API.",
                       {"query": {"type": "string"}}, ("query",)),
    "submit": _fn("submit", "Finish; the scene is then exported and checked in a browser."),
}

SYSTEM_PROMPT = """You build 3D scenes by editing an entity-component scene through tools; the scene is then rendered with Three.js.
A script component's source is the body of function(self, dt, ctx), run 60 times a second: self is the entity's Three.js
object, dt the step in seconds, ctx has time, score, key(name) (is that key held?), find(entity name), addScore(n) and THREE.
To use a tool, reply with exactly one call in this form and nothing after it:
<tool_call>
{{"name": "TOOL", "arguments": {{...}}}}
</tool_call>
The tools (arguments marked ? are optional):
{tools}"""


class SceneEnv:
    """One episode at a time over scene3d tasks; reusable after `close()`."""

    max_calls_per_turn = 8

    def __init__(self, pool: BrowserPool | None = None, timeout_s: float = 30.0):
        self.pool = pool
        self.timeout_s = timeout_s
        self.task = None
        self.world: World | None = None
        self.submitted = False
        self.report: Report | None = None  # the last verify()'s per-check results

    def tools(self) -> list[dict]:
        return list(TOOLS.values())

    def reset(self, task, seed: int = 0) -> tuple[list[dict], dict]:
        self.task, self.submitted, self.report = task, False, None
        self.world = World.restore(json.loads(task.start))
        system = SYSTEM_PROMPT.format(tools=describe(self.tools()))
        return ([{"role": "system", "content": system}, {"role": "user", "content": task.instruction}],
                {"task_id": task.task_id, "family": task.family, "version": task.version})

    def step(self, message) -> StepResult:
        calls = parse_message(message)
        if not calls:
            note = ("No tool call found in your reply. Call one tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, "
                    "or call submit when you are done.")
            return StepResult([{"role": "user", "content": note}], 0.0, False, False, {"tool_calls": 0, "invalid_calls": 1})
        observations, invalid, failed = [], 0, 0
        for k, call in enumerate(calls):
            if k >= self.max_calls_per_turn:
                text = f"error: only {self.max_calls_per_turn} tool calls are run per reply; this one was skipped"
            else:
                problem = call.error or check_arguments(call, TOOLS)
                invalid += bool(problem)
                text = f"error: {problem}" if problem else self._execute(call.name, call.arguments)
                failed += not problem and text.startswith("error:")
            msg = {"role": "tool", "content": text, "name": call.name} if call.name else {"role": "tool", "content": text}
            if call.id:
                msg["tool_call_id"] = call.id
            observations.append(msg)
            if self.submitted:
                break
        info = {"tool_calls": len(calls), "invalid_calls": invalid, "failed_calls": failed}
        return StepResult(observations, 0.0, self.submitted, False, info)

    def verify(self) -> Score:
        """Export the final world and run the task's checks in the browser; reward = fraction passed."""
        if self.world is None:
            raise RuntimeError("verify() needs a reset() episode")
        self.report = verify_world(self.world, list(self.task.checks), self.timeout_s, self.pool)
        if self.report.passed:
            return Score(1.0, True, "pass")
        hung = any("did not answer" in r.reason for r in self.report.results)
        return Score(self.report.score, False, "timeout" if hung else "fail")

    def close(self) -> None:
        self.world = None

    def _execute(self, name: str, a: dict) -> str:
        w = self.world
        try:
            if name == "create_entity":
                w.create_entity(a["entity"], a.get("parent"))
                return f"created {a['entity']}"
            if name == "set_component":
                now = w.set_component(a["entity"], a["component"], a["values"])
                return f"{a['entity']}.{a['component']} = {json.dumps(now)}"
            if name == "remove_component":
                w.remove_component(a["entity"], a["component"])
                return f"removed {a['component']} from {a['entity']}"
            if name == "remove_entity":
                return "removed " + ", ".join(w.remove_entity(a["entity"]))
            if name == "list_entities":
                return w.describe()
            if name == "search_assets":
                return assets.search(a["query"])
            if name == "search_docs":
                return docs.search(a["query"])
            self.submitted = True
            return "submitted"
        except LonghaulError as e:
            return f"error: {e}"
