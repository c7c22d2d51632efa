"""Chat messages -> prompt token ids, and a reply's Hermes tool calls -> OpenAI `tool_calls`.

Owns rendering a chat request through the tokenizer's chat template (OpenAI content parts
joined, `developer` as `system`, an assistant's `tool_calls` written back in the Hermes text
form the model produces, tool results as `tool` messages) and the tools prompt: a template
that reads `tools` gets them; for one that does not (SmolLM2's, the tiny models' ChatML) the
schemas and the call format go into the system message, the same form the agent envs use.
Tool calls in a reply are read by `longhaul.envs.tools.parse_text`, the parser the agent loop
uses; this module only maps them to OpenAI's shape. Does not own sampling or the routes.

`tool_choice` "required" or a named function is a prompt instruction, not a constraint on
decoding (the engine has no guided decoding); "none" leaves the tools out of the prompt.
"""

from __future__ import annotations

import json
import uuid

from longhaul.envs.tools import parse_text
from longhaul.serve.openai_api.protocol import ChatCompletionRequest, bad_request

TOOL_OPEN = "<tool_call>"
TOOLS_PROMPT = """You may call functions to help with the user's request. To call one, reply with
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>
The functions (OpenAI function schemas):
{schemas}"""


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if p.type != "text" or p.text is None:
            raise bad_request(f"content parts of type {p.type!r} are not supported; send text", "messages")
        parts.append(p.text)
    return "".join(parts)


def _call_text(tc: dict) -> str:
    fn = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request("an assistant tool call needs function.name and function.arguments", "messages")
    args = fn.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        raise bad_request(f"the arguments of tool call {fn['name']!r} are not valid JSON", "messages") from None
    return TOOL_OPEN + "\n" + json.dumps({"name": fn["name"], "arguments": args}) + "\n</tool_call>"


def to_template_messages(req: ChatCompletionRequest) -> list[dict]:
    out = []
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        content = _text(m.content)
        if m.role == "assistant" and m.tool_calls:
            content = "\n".join([content] * bool(content) + [_call_text(tc) for tc in m.tool_calls])
        out.append({"role": role, "content": content})
    return out


def _tool_instruction(req: ChatCompletionRequest) -> str:
    choice = req.tool_choice
    if choice == "required":
        return "\nYou must call one of the functions."
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str) or name not in {t.function.name for t in req.tools}:
            raise bad_request("tool_choice names a function that is not in tools", "tool_choice")
        return f"\nYou must call the function {name}."
    return ""


def render(tok, req: ChatCompletionRequest) -> list[int]:
    """Prompt token ids of a chat request (generation prompt added)."""
    messages = to_template_messages(req)
    kwargs = {}
    if req.tools and req.tool_choice != "none":
        schemas = [t.model_dump(exclude_none=True) for t in req.tools]
        if "tools" in (getattr(tok, "chat_template", None) or ""):
            kwargs["tools"] = schemas
        else:
            prompt = TOOLS_PROMPT.format(schemas="\n".join(json.dumps(s) for s in schemas)) + _tool_instruction(req)
            if messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}
            else:
                messages.insert(0, {"role": "system", "content": prompt})
    if not getattr(tok, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tok.encode(text, add_special_tokens=False)


def extract_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a reply. Only a reply whose every call parses becomes tool
    calls; otherwise the text stays content (the client sees what the model wrote)."""
    calls = parse_text(text) if TOOL_OPEN in text else []
    if not calls or any(c.error for c in calls):
        return text, []
    content = text.split(TOOL_OPEN, 1)[0].strip() or None
    return content, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]


def streamable_prefix(text: str, tools: bool) -> int:
    """How much of a reply's text may be streamed as content now: all of it without tools;
    with tools, up to a `<tool_call>` (or a possible start of one at the end)."""
    if not tools:
        return len(text)
    i = text.find(TOOL_OPEN)
    if i >= 0:
        return i
    for k in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)
