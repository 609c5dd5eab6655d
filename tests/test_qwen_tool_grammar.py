"""Qwen3.5 / 3.6's tool calls (Qwen3-Coder's XML) as a grammar, checked against Qwen's own chat
templates: every call they render (strings over several lines holding `</b>`, numbers, the
template's `True`, enums, JSON arrays and objects, several calls) is accepted whole, read back by
the format's parser, and valid by `jsonschema`; calls that break their schema are not. Then a
forced call and a JSON answer on the tiny Qwen3.5 target, drafting on == off."""

import json

import jsonschema
import pytest

import tiny_qwen
from mlx_spec import load
from mlx_spec.constraints.tools import with_tools

FIND = {"type": "object", "required": ["path", "count"], "properties": {
    "path": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
    "recursive": {"type": "boolean"}, "mode": {"enum": ["fast", "slow"]}, "tags": {"type": "array", "items": {"type": "string"}},
    "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}, "required": ["depth"]}}}
TOOLS = [{"type": "function", "function": {"name": "find_files", "description": "Find files", "parameters": FIND}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
VALID = [
    {"path": "/tmp/a </b>\nx", "count": 3},
    {"path": "", "count": -12, "ratio": 0.25, "recursive": True, "mode": "slow", "tags": ["x", "y z"], "opts": {"depth": 2}},
    {"path": "a", "count": 0, "recursive": False, "tags": []},
]
INVALID = [{"path": "x"}, {"path": "x", "count": "three"}, {"path": "x", "count": 2.5}, {"path": "x", "count": 1, "mode": "medium"},
           {"path": "x", "count": 1, "opts": {"deep": 1}}]


@pytest.fixture(scope="module", params=["3.5", "3.6"])
def engine(tmp_path_factory, request):
    folder = tiny_qwen.build(tmp_path_factory.mktemp(f"qwen-tools-{request.param}"))
    return load(str(tiny_qwen.save_tokenizer(folder, request.param)))


def rendered_calls(engine, arguments_list):
    """The calls Qwen's template writes in a conversation's history (the assistant turn's)."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "find_files", "arguments": a}}
             for i, a in enumerate(arguments_list)]
    messages = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c0", "content": "done"}]
    text = engine.tokenizer.apply_chat_template(engine.text.format.for_template(messages), tools=TOOLS, tokenize=False)
    start = text.index("<tool_call>", text.rindex("<|im_start|>assistant"))
    return text[start: text.rindex("</tool_call>") + len("</tool_call>")]


def accepts(engine, choice, block) -> bool:
    matcher = engine.grammars.matcher(with_tools(None, choice, TOOLS, engine.text.format, engine.tokenizer))
    ids = engine.tokenizer.encode(block, add_special_tokens=False)
    return matcher.matcher.try_consume_tokens(ids) == len(ids) and matcher.matcher.is_accepting()


def test_every_call_qwen_s_template_writes_is_accepted(engine):
    for arguments in [*([a] for a in VALID), VALID]:  # one call each, then all of them
        block = rendered_calls(engine, arguments)
        assert accepts(engine, "required", block) and accepts(engine, "find_files", block)
        assert not accepts(engine, "get_time", block)
        calls = engine.text.format.parse_tool_calls(block, TOOLS)
        assert [c["arguments"] for c in calls] == arguments
        for call in calls:
            jsonschema.validate(call["arguments"], FIND)


@pytest.mark.parametrize("arguments", INVALID)
def test_calls_that_break_their_schema_are_refused(engine, arguments):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(arguments, FIND)
    assert not accepts(engine, "required", rendered_calls(engine, [arguments]))


def test_a_forced_call_and_a_json_answer_drafting_on_and_off(engine):
    question = [{"role": "user", "content": "What time is it in Taipei?"}]
    off = engine.generate(question, tools=TOOLS, tool_choice="get_time", max_tokens=120, mtp=False)
    on = engine.generate(question, tools=TOOLS, tool_choice="get_time", max_tokens=120)
    assert on.tokens == off.tokens and on.tool_calls  # (the random model may call on to its limit)
    for call in on.tool_calls:
        assert call["name"] == "get_time"
        jsonschema.validate(call["arguments"], TOOLS[1]["function"]["parameters"])
    assert on.stats.kept_by_source.get("grammar", 0) > 0
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    answer = engine.generate(question, json_schema=schema, max_tokens=40, draft_tokens=2)
    assert answer.tokens == engine.generate(question, json_schema=schema, max_tokens=40, mtp=False).tokens
    jsonschema.validate(json.loads(answer.text), schema)


def test_with_thinking_the_thought_comes_first(engine):
    """Thinking on: the prompt opens the thought; the model's thought, its `</think>` and blank
    lines, then the calls, as Qwen's template writes a turn back, are accepted whole; and a forced
    call with thinking on decodes the same drafting on and off."""
    grammar = with_tools(None, "required", TOOLS, engine.text.format, engine.tokenizer, thinking=True)
    matcher = engine.grammars.matcher(grammar)
    turn = "The user wants files.\n</think>\n\n" + rendered_calls(engine, [VALID[1]])
    ids = engine.tokenizer.encode(turn, add_special_tokens=False)
    assert matcher.matcher.try_consume_tokens(ids) == len(ids) and matcher.matcher.is_accepting()
    question = [{"role": "user", "content": "Find files."}]
    off = engine.generate(question, tools=TOOLS, tool_choice="required", thinking=True, max_tokens=60, mtp=False)
    on = engine.generate(question, tools=TOOLS, tool_choice="required", thinking=True, max_tokens=60)
    assert on.tokens == off.tokens
