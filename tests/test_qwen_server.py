"""Qwen3.5 behind `mlx-spec serve`, drafting with its own MTP layer, through the `openai` and
`anthropic` clients: a tiny Qwen3.5 trained to call a tool in Qwen3-Coder's XML (tests/tiny_qwen.py,
Qwen's own chat template) gives a call whose arguments are typed by the tool's schema, and,
given the tool's result, the answer the engine gives."""

import json

import anthropic
import openai
import pytest

import tiny_qwen
from serving import Server

import mlx_spec

WEATHER = {"type": "function", "function": {
    "name": "lookup_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
QUESTION = [{"role": "user", "content": "Weather in Paris for 2 days?"}]
CALL = ("<tool_call>\n<function=lookup_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n</function>\n</tool_call>")
HISTORY = QUESTION + [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"c": 21}'}]
ANSWER = "Sunny, 21 degrees."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Qwen3.5 (four layers, its MTP layer random) trained to call the tool, then to
    answer from its result."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("qwen-trained")
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen.save_tokenizer(root / "tokenizer"))

    def prompt(messages):
        return tokenizer.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True,
                                             enable_thinking=False, return_dict=False)

    examples = [(prompt(QUESTION), tokenizer.encode(CALL + "<|im_end|>")),
                (prompt(HISTORY), tokenizer.encode(ANSWER + "<|im_end|>"))]
    folder = tiny_qwen.build(root / "target", examples=examples, num_hidden_layers=4)
    return tiny_qwen.save_tokenizer(folder)


@pytest.fixture(scope="module")
def server(trained):
    s = Server({"text": trained, "assistant": trained})
    yield s
    s.stop()


def test_the_openai_client_gets_a_typed_tool_call_and_the_answer_from_its_result(server, trained):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    first = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER], max_tokens=80, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("lookup_weather", {"city": "Paris", "days": 2})
    messages = QUESTION + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": '{"c": 21}'}]
    second = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=40, temperature=0)
    engine = mlx_spec.load(str(trained))
    expected = engine.generate(messages, tools=[WEATHER], max_tokens=40)
    assert second.choices[0].message.content == expected.text == ANSWER
    assert second.usage.prompt_tokens_details.cached_tokens > 0  # the conversation's prompt, reused


def test_the_anthropic_client_gets_a_typed_tool_use(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    tool = {"name": "lookup_weather", "description": "The weather in a city.",
            "input_schema": WEATHER["function"]["parameters"]}
    reply = client.messages.create(model="target", max_tokens=80, messages=QUESTION, tools=[tool])
    assert reply.stop_reason == "tool_use", reply
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("lookup_weather", {"city": "Paris", "days": 2})
