import json

import pytest

from longhaul.envs import patch as patchlib
from longhaul.envs.tools import TOOLS, ToolCall, check_arguments, format_call, parse_message, parse_openai, parse_text, schemas


def test_schemas_are_openai_function_schemas():
    names = [s["function"]["name"] for s in schemas()]
    assert names == ["read_file", "write_file", "apply_patch", "list_dir", "run", "run_tests", "submit"]
    for s in schemas():
        assert s["type"] == "function"
        params = s["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    json.dumps(schemas())  # serialisable as sent to an OpenAI client


def test_hermes_text_calls_in_order_with_an_unclosed_last_block():
    text = ('I will look first.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
            '<tool_call>{"name": "run", "arguments": {"command": "ls"}}')
    calls = parse_text(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("read_file", {"path": "a.py"}, None), ("run", {"command": "ls"}, None)]


def test_fenced_json_inside_a_tool_call_and_parameters_alias():
    calls = parse_text('<tool_call>```json\n{"name": "list_dir", "parameters": {"path": "."}}\n```</tool_call>')
    assert calls[0].name == "list_dir" and calls[0].arguments == {"path": "."} and calls[0].error is None


@pytest.mark.parametrize("body, fragment", [
    ("{bad json", "not valid JSON"),
    ('["read_file"]', "must be a JSON object"),
    ('{"arguments": {}}', "no 'name'"),
    ('{"name": "run", "arguments": "{not json"}', "not valid JSON"),
    ('{"name": "run", "arguments": [1, 2]}', "must be a JSON object"),
])
def test_malformed_text_calls_become_errors_not_exceptions(body, fragment):
    (call,) = parse_text(f"<tool_call>{body}</tool_call>")
    assert call.error and fragment in call.error


def test_openai_tool_calls_structure_with_string_arguments_and_ids():
    tcs = [{"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps({"path": "x", "content": "y"})}},
           {"id": "call_2", "type": "function", "function": {"name": "submit", "arguments": ""}}]
    calls = parse_openai(tcs)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_1", "write_file", {"path": "x", "content": "y"}), ("call_2", "submit", {})]
    # an assistant message with tool_calls wins over its text
    assert parse_message({"role": "assistant", "content": "<tool_call>{}</tool_call>", "tool_calls": tcs})[0].name == "write_file"


def test_plain_text_has_no_calls():
    assert parse_text("Here is my plan: read the file, then fix it.") == []
    assert parse_message({"role": "assistant", "content": None}) == []


@pytest.mark.parametrize("call, fragment", [
    (ToolCall("rm_rf", {}), "unknown tool"),
    (ToolCall("read_file", {}), "needs the argument 'path'"),
    (ToolCall("read_file", {"path": 3}), "must be a string"),
    (ToolCall("read_file", {"path": "a", "mode": "x"}), "has no argument 'mode'"),
    (ToolCall("run", {"command": "ls", "timeout": True}), "must be a number"),
    (ToolCall("read_file", {"path": "a", "start_line": 1.5}), "must be a integer"),
])
def test_argument_checks(call, fragment):
    assert fragment in check_arguments(call)


def test_valid_arguments_pass_and_format_call_round_trips():
    for name in TOOLS:
        text = format_call(name, **({"path": "a", "content": "b"} if name == "write_file" else {}))
        (call,) = parse_text(text)
        assert call.name == name
    assert check_arguments(ToolCall("run", {"command": "ls", "timeout": 3})) is None


SRC = "".join(f"line {i}\n" for i in range(1, 21))


def test_patch_round_trip_with_make():
    new = SRC.replace("line 5\n", "line five\n").replace("line 17\n", "")
    diff = patchlib.make("f.txt", SRC, new)
    assert patchlib.apply(diff, lambda p: SRC if p == "f.txt" else None) == {"f.txt": new}


def test_patch_tolerates_a_shifted_hunk_but_never_mismatched_context():
    new = SRC.replace("line 10\n", "line ten\n")
    diff = patchlib.make("f.txt", SRC, new)
    shifted = "head\nhead\n" + SRC
    assert patchlib.apply(diff, lambda p: shifted)["f.txt"] == "head\nhead\n" + new
    with pytest.raises(patchlib.PatchError, match="does not match"):
        patchlib.apply(diff, lambda p: SRC.replace("line 9\n", "line nine\n"))


def test_patch_creates_and_deletes_files_and_reads_git_headers():
    create = "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
    assert patchlib.apply(create, lambda p: None) == {"new.py": "a = 1\nb = 2\n"}
    with pytest.raises(patchlib.PatchError, match="already exists"):
        patchlib.apply(create, lambda p: "x\n")
    delete = "--- a/old.py\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-x = 1\n"
    assert patchlib.apply(delete, lambda p: "x = 1\n") == {"old.py": None}


def test_patch_no_newline_marker_and_missing_file():
    diff = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n\\ No newline at end of file\n"
    assert patchlib.apply(diff, lambda p: "old") == {"f": "new"}
    with pytest.raises(patchlib.PatchError, match="does not exist"):
        patchlib.apply(diff, lambda p: None)


@pytest.mark.parametrize("bad, fragment", [
    ("just some text", "no hunks"),
    ("@@ -1 +1 @@\n-a\n+b\n", "before any"),
    ("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n-a\n+b\n", "header says"),
])
def test_malformed_patches_name_the_problem(bad, fragment):
    with pytest.raises(patchlib.PatchError, match=fragment):
        patchlib.apply(bad, lambda p: "a\n")
