"""Gemma 4's tool calls as a grammar, checked against what we did not write: every call Google's
own template renders (arguments of every JSON type, nested, keys as its `dictsort` orders them)
is accepted whole by the grammar, read back by the format's parser, and valid by `jsonschema`;
calls whose arguments break their schema are not. Then forced tool choices, end to end: the
trained tiny target's calls, drafting on == off, every call valid."""

import json
import re

import jsonschema
import pytest

from chat_script import QUESTION_MESSAGES, TOOLS
from mlx_spec import load
from mlx_spec.constraints.tools import with_tools
from mlx_spec.errors import SettingsError
from mlx_spec.models.gemma4.chat_format import for_template

FIND = {"type": "object", "required": ["path", "count"], "properties": {
    "path": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
    "Recursive": {"type": "boolean"}, "mode": {"enum": ["fast", "slow"]}, "tags": {"type": "array", "items": {"type": "string"}},
    "opts": {"type": "object", "properties": {"depth": {"type": "integer"}, "follow": {"type": "boolean"}}, "required": ["depth"]},
    "note": {"type": ["string", "integer"]}, "-i": {"type": "boolean"}}}
TOOLS_FOR_GRAMMAR = [{"type": "function", "function": {"name": "find_files", "description": "Find files", "parameters": FIND}},
                     *TOOLS]
VALID = [
    {"path": "/tmp/a b<c", "count": 3},
    {"path": "", "count": -12, "ratio": 0.25, "Recursive": True, "mode": "slow", "tags": ["x", "y z"],
     "opts": {"depth": 2, "follow": False}, "note": 7, "-i": False},
    {"count": 0, "path": "x", "tags": [], "opts": {"depth": 1}, "note": "a, b: {c}"},
]
INVALID = [
    {"path": "x"},  # a required key missing
    {"path": "x", "count": "3"},  # a string where an integer goes
    {"path": "x", "count": 3, "mode": "medium"},  # outside the enum
    {"path": "x", "count": 3, "opts": {"follow": True}},  # a nested required key missing
    {"path": "x", "count": 3, "ratio": "high"},
    {"path": "x", "count": 2.5},  # a fraction where an integer goes
]


@pytest.fixture(scope="module")
def engine(trained, checkpoints):
    return load(str(trained), str(checkpoints["assistant"]))


def rendered_call(engine, name, arguments):
    """The call block Google's template writes for this call in a conversation's history."""
    messages = [{"role": "user", "content": "Go."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    text = engine.tokenizer.apply_chat_template(for_template(messages), tools=TOOLS_FOR_GRAMMAR, tokenize=False)
    return re.search(r"<\|tool_call>.*?<tool_call\|>", text, re.DOTALL).group(0)


def accepts(engine, choice, block) -> bool:
    matcher = engine.grammars.matcher(with_tools(None, choice, TOOLS_FOR_GRAMMAR, engine.text.format, engine.tokenizer))
    ids = engine.tokenizer.encode(block, add_special_tokens=False)
    return matcher.matcher.try_consume_tokens(ids) == len(ids) and matcher.matcher.is_accepting()


@pytest.mark.parametrize("arguments", VALID)
def test_every_call_google_s_template_writes_is_accepted(engine, arguments):
    block = rendered_call(engine, "find_files", arguments)
    assert accepts(engine, "required", block) and accepts(engine, "find_files", block)
    assert not accepts(engine, "get_current_time", block)  # another tool named: refused
    (call,) = engine.text.format.parse_tool_calls(block, TOOLS_FOR_GRAMMAR)
    assert call["name"] == "find_files" and call["arguments"] == arguments
    jsonschema.validate(call["arguments"], FIND)


@pytest.mark.parametrize("arguments", INVALID)
def test_calls_that_break_their_schema_are_refused(engine, arguments):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(arguments, FIND)
    assert not accepts(engine, "required", rendered_call(engine, "find_files", arguments))


@pytest.mark.parametrize("choice", ["required", "get_current_time"])
@pytest.mark.parametrize("drafting", [{"mtp": False}, {}, {"draft_tokens": 3}])
def test_a_forced_call_drafting_on_and_off(engine, choice, drafting):
    off = engine.generate(QUESTION_MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=80, mtp=False)
    result = engine.generate(QUESTION_MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=80, **drafting)
    assert result.tokens == off.tokens and result.finish_reason == "tool_calls"
    assert [c["arguments"] for c in result.tool_calls] == [{"city": "Taipei"}, {"city": "New York"}]
    if drafting.get("mtp") is not False:
        assert result.stats.kept_by_source["grammar"] > 20  # the markers, `call:` and the name, forced


def test_a_greeting_with_a_call_forced_still_calls(engine):
    """Asked to greet, with a call forced: a call, valid by its schema, whatever the model
    would rather write."""
    weather = {"type": "object", "required": ["city", "days"], "properties": {  # (bounded: the tiny model rambles)
        "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}}}
    tools = [*TOOLS, {"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
    result = engine.generate([{"role": "user", "content": "Hello there"}], tools=tools, tool_choice="get_weather",
                             max_tokens=200, temperature=1.0, seed=2)
    assert result.finish_reason == "tool_calls", result.tokens
    for call in result.tool_calls:
        assert call["name"] == "get_weather"
        jsonschema.validate(call["arguments"], weather)


def test_a_json_answer_or_a_call(engine):
    """A JSON schema beside tools: the model's calls (what it writes here) are still possible."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 16}}, "required": ["answer"]}
    result = engine.generate(QUESTION_MESSAGES, tools=TOOLS, json_schema=schema, max_tokens=80)
    assert result.finish_reason == "tool_calls" and len(result.tool_calls) == 2
    none = engine.generate(QUESTION_MESSAGES, tools=TOOLS, json_schema=schema, tool_choice="none", max_tokens=80)
    jsonschema.validate(json.loads(none.text), schema)


def test_a_thought_first_then_what_is_held(engine):
    """Thinking on: the thought channel first, free (the trained greeting's thought), then the
    JSON answer, or the forced calls; drafting on == off."""
    schema = {"type": "object", "properties": {"reply": {"type": "string", "maxLength": 20}}, "required": ["reply"],
              "additionalProperties": False}
    greeting = [{"role": "user", "content": "Hello there"}]
    off = engine.generate(greeting, json_schema=schema, thinking=True, max_tokens=80, mtp=False)
    result = engine.generate(greeting, json_schema=schema, thinking=True, max_tokens=80)
    assert result.tokens == off.tokens and result.thinking == "The user says hello."
    jsonschema.validate(json.loads(result.text), schema)
    calls = engine.generate(QUESTION_MESSAGES, tools=TOOLS, tool_choice="required", thinking=True, max_tokens=80)
    assert calls.finish_reason == "tool_calls" and calls.tool_calls


@pytest.mark.parametrize("settings, words", [
    ({"tool_choice": "required"}, "needs tools"),
    ({"tool_choice": "send_mail", "tools": TOOLS}, "not among the tools"),
    ({"tool_choice": 3}, "tool_choice must be"),
    ({"regex": "[a-z]+", "tools": TOOLS}, "regex beside tools"),
])
def test_bad_tool_choices_are_named(engine, settings, words):
    with pytest.raises(SettingsError, match=words):
        engine.generate(QUESTION_MESSAGES, max_tokens=8, **settings)


def test_numbers_no_parser_reads_back_are_refused(engine):
    """A float's range ends near 1e308: `1e999` (which the parser drops, so a forced call would
    come back as none) and a 400-digit integer are not writable; 18 digits and 1e99 are."""
    def block(count):
        return f'<|tool_call>call:find_files{{count:{count},path:<|"|>x<|"|>}}<tool_call|>'

    assert accepts(engine, "required", block("123456789012345678")) and accepts(engine, "required", block("-3"))
    for count in ("1e999", "9" * 400):
        assert not accepts(engine, "required", block(count))
    assert not engine.text.format.parse_tool_calls(block("1e999"), TOOLS_FOR_GRAMMAR)  # (why: it is dropped)
