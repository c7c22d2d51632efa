"""The agent's tools: their OpenAI function schemas, and tool calls parsed out of model output.

Two call forms are read: the Hermes/Qwen text form `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` (what small open models emit), and the OpenAI `tool_calls` structure (what a
chat-completions client sends). Parsing never raises: anything malformed comes back as a
`ToolCall` with `error` set, which the env turns into an observation the model can recover
from. Executing the tools is the env's job (`longhaul.envs.workspace`), not this module's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


def _fn(name: str, description: str, properties: dict | None = None, required: tuple = ()) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties or {}, "required": list(required)}}}


_PATH = {"type": "string", "description": "path relative to the workspace root /work"}
TOOLS = {
    "read_file": _fn("read_file", "Read a text file of the workspace.", {
        "path": _PATH,
        "start_line": {"type": "integer", "description": "first line to show (1-based), default 1"},
        "end_line": {"type": "integer", "description": "last line to show, default the end"}}, ("path",)),
    "write_file": _fn("write_file", "Create or overwrite a file with the given content.",
                      {"path": _PATH, "content": {"type": "string"}}, ("path", "content")),
    "apply_patch": _fn("apply_patch", "Apply a unified diff (as `diff -u` or `git diff` prints it) to workspace files.",
                       {"patch": {"type": "string"}}, ("patch",)),
    "list_dir": _fn("list_dir", "List a directory of the workspace (directories end with '/').",
                    {"path": {**_PATH, "description": "directory, default the workspace root"}}),
    "run": _fn("run", "Run a shell command in the workspace (bash; git, python3, pytest and ruff are installed; no network).", {
        "command": {"type": "string"},
        "timeout": {"type": "number", "description": "seconds before the command is stopped, default 30"}}, ("command",)),
    "run_tests": _fn("run_tests", "Run the task's visible tests and show their output."),
    "submit": _fn("submit", "Finish the task; the hidden tests then decide the result."),
}


def schemas(names=None) -> list[dict]:
    """OpenAI function schemas of the named tools (all of them by default), in a stable order."""
    return [TOOLS[n] for n in (names or TOOLS)]


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # why the call could not be read; the env reports it to the model
    id: str | None = None  # the OpenAI call id, echoed back in the tool message


_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _from_obj(obj, call_id=None) -> ToolCall:
    if not isinstance(obj, dict):
        return ToolCall("", error="a tool call must be a JSON object with 'name' and 'arguments'", id=call_id)
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI {"type": "function", "function": {...}}
        call_id = obj.get("id", call_id)
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", error="the tool call has no 'name'", id=call_id)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, error=f"the arguments of {name!r} are not valid JSON ({e.msg} at char {e.pos})", id=call_id)
    if not isinstance(args, dict):
        return ToolCall(name, error=f"the arguments of {name!r} must be a JSON object", id=call_id)
    return ToolCall(name, args, id=call_id)


def describe(tools: list[dict]) -> str:
    """Function schemas as one line per tool, `name(arg, optional_arg?): description`: the same
    tools and arguments as the JSON schemas in about a quarter of the tokens, which a small
    model's context (and every training row that carries the system prompt) pays for."""
    lines = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters", {})
        required = set(params.get("required", ()))
        args = ", ".join(k if k in required else k + "?" for k in params.get("properties", {}))
        lines.append(f"- {fn['name']}({args}): {fn.get('description', '').strip()}")
    return "\n".join(lines)


def parse_text(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` block of a reply, in order (an unclosed last block counts)."""
    calls = []
    for m in _CALL.finditer(text):
        body = m.group(1).strip()
        if body.startswith("```"):  # some models fence the JSON
            body = body.strip("`").removeprefix("json").strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({e.msg} at char {e.pos}); "
                                             'write <tool_call>{"name": "...", "arguments": {...}}</tool_call>'))
            continue
        calls.append(_from_obj(obj))
    return calls


def parse_openai(tool_calls) -> list[ToolCall]:
    """The OpenAI `message.tool_calls` list (dicts, or objects with `model_dump()`)."""
    out = []
    for tc in tool_calls or []:
        if hasattr(tc, "model_dump"):
            tc = tc.model_dump()
        out.append(_from_obj(tc, tc.get("id") if isinstance(tc, dict) else None))
    return out


def parse_message(message: dict | str) -> list[ToolCall]:
    """Tool calls of an assistant message: its `tool_calls` when present, else its text."""
    if isinstance(message, str):
        return parse_text(message)
    if message.get("tool_calls"):
        return parse_openai(message["tool_calls"])
    return parse_text(message.get("content") or "")


def check_arguments(call: ToolCall, tools: dict | None = None) -> str | None:
    """Why a call does not fit its tool's schema (unknown tool, missing or mistyped argument), else None;
    `tools` is a name -> schema dict (default: the workspace tools)."""
    tools = TOOLS if tools is None else tools
    if call.name not in tools:
        return f"unknown tool {call.name!r}; the tools are {', '.join(tools)}"
    params = tools[call.name]["function"]["parameters"]
    for req in params["required"]:
        if req not in call.arguments:
            return f"{call.name} needs the argument {req!r}"
    types = {"string": str, "integer": int, "number": (int, float), "object": dict, "boolean": bool}
    for key, value in call.arguments.items():
        spec = params["properties"].get(key)
        if spec is None:
            return f"{call.name} has no argument {key!r}; its arguments are {', '.join(params['properties']) or 'none'}"
        want = types[spec["type"]]
        if not isinstance(value, want) or (isinstance(value, bool) and spec["type"] != "boolean"):
            return f"{call.name}: argument {key!r} must be a {spec['type']}, got {type(value).__name__}"
    return None


def format_call(name: str, **arguments) -> str:
    """The text form of one call, as a model should write it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
