"""Tool calls end to end: a tiny model trained (here, in seconds) to answer a weather question
with a Hermes `<tool_call>`, served from a manifest-verified directory through a file://
URL, returns OpenAI `tool_calls` to the real client, streamed and not. Plus the mapping
and the prompt rendering on their own."""

import json

import openai
import pytest
import torch

from longhaul.models import load_policy
from longhaul.serve.openai_api.chat import extract_tool_calls, render, streamable_prefix
from longhaul.serve.openai_api.protocol import APIError, ChatCompletionRequest
from longhaul.serve.weights import write_manifest
from tests.serve.conftest import running_server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """tiny-llama fine-tuned until its greedy reply to ASK (with TOOLS) is exactly CALL."""
    model, tok = load_policy("tiny-llama")
    ids = render(tok, ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS}))
    target = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    x = torch.tensor([ids + target])
    labels = x.clone()
    labels[0, :len(ids)] = -100
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(400):
        loss = model(x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.02:
            with torch.no_grad():
                out = model.generate(x[:, :len(ids)], max_new_tokens=len(target), do_sample=False)[0, len(ids):].tolist()
            if out == target:
                break
    else:
        pytest.fail("the tiny model did not learn the tool call")
    d = tmp_path_factory.mktemp("tool-model")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    write_manifest(d)
    return d


def test_server_returns_tool_calls_from_the_models_text(tool_model_dir, tmp_path):
    with running_server(tmp_path, model=f"file://{tool_model_dir}", served_model_name="tool-llama", max_model_len=1024) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tool-llama", messages=ASK, tools=TOOLS, temperature=0, max_tokens=100)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        chunks = list(client.chat.completions.create(model="tool-llama", messages=ASK, tools=TOOLS, temperature=0, max_tokens=100,
                                                     stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert not "".join(d.content or "" for d in deltas)  # the call's text is not streamed as content
        (tc,) = [t for d in deltas for t in (d.tool_calls or [])]
        assert tc.index == 0 and tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # without tools in the request the same text is plain content
        plain = client.chat.completions.create(model="tool-llama", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                               max_tokens=100)
        assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")


def test_extract_tool_calls_maps_hermes_text_to_openai():
    content, calls = extract_tool_calls("Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert content == "Let me look." and [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "Oslo"]
    assert all(c["type"] == "function" and c["function"]["name"] == "get_weather" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    broken = "<tool_call>{not json}</tool_call>"
    assert extract_tool_calls(broken) == (broken, [])  # unparseable: the client sees the text
    assert extract_tool_calls("no call here") == ("no call here", [])


def test_render_puts_tools_in_the_system_prompt_and_history_in_hermes_form():
    tok = load_policy("tiny-llama")[1]
    req = ChatCompletionRequest.model_validate({"tools": TOOLS, "messages": [
        {"role": "developer", "content": "Be brief."}, *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    text = tok.decode(render(tok, req))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou may call functions") and '"name": "get_weather"' in text
    assert "<|im_start|>assistant\n" + CALL + "<|im_end|>" in text and "<|im_start|>tool\nsunny<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    bad = ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    with pytest.raises(APIError, match="tool_choice"):
        render(tok, bad)


def test_streamable_prefix_holds_back_a_possible_tool_call():
    assert streamable_prefix("hello <tool", True) == len("hello ")
    assert streamable_prefix("hello <tool_call>{", True) == len("hello ")
    assert streamable_prefix("a < b", True) == len("a < b")
    assert streamable_prefix("hello <tool", False) == len("hello <tool")
