"""Structured outputs through the official clients' own helpers, against a real `mlx-spec serve`:
OpenAI's `chat.completions.parse` and `responses.parse` with a pydantic model, `json_object`,
forced tool calls, the Agents SDK with tools and `output_type=`, pydantic-ai's native output,
langchain-openai's `with_structured_output`,
Anthropic's `messages.parse`; each answer validated by `jsonschema` against the schema the client
sent, and token for token `Engine.generate`'s under the same schema, streamed or not."""

import json
from typing import Annotated, List, Literal

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from mlx_spec import load
from serving import Server

KEY = "sk-structured"


class Weather(BaseModel):
    # Bounded, so that the tiny model's answer fits its tokens (it writes long strings freely).
    city: str = Field(max_length=12)
    degrees: int = Field(ge=-50, le=60)
    sky: Literal["sunny", "cloudy", "rain"]
    warnings: List[Annotated[str, Field(max_length=8)]] = Field(max_length=2)


class Forecast(BaseModel):
    """For Anthropic's client, which moves a schema's bounds into descriptions: nothing unbounded."""

    sky: Literal["sunny", "cloudy", "rain"]
    umbrella: bool


@pytest.fixture(scope="module")
def server(trained, checkpoints):
    s = Server({"text": trained, "assistant": checkpoints["assistant"]}, "--api-key", KEY, "--max-tokens", "160")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine(trained, checkpoints):
    return load(str(trained), str(checkpoints["assistant"]))


@pytest.fixture(scope="module")
def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(oa):
    return oa.models.list().data[0].id


QUESTION = [{"role": "user", "content": "What is the weather in Taipei?"}]


def strict_schema():
    """The schema OpenAI's client sends for `Weather` (its own conversion)."""
    from openai.lib._pydantic import to_strict_json_schema

    return to_strict_json_schema(Weather)


def test_chat_parse_with_a_pydantic_model(oa, model, engine, server):
    completion = oa.chat.completions.parse(model=model, messages=QUESTION, response_format=Weather, max_tokens=160)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Weather)
    jsonschema.validate(json.loads(message.content), strict_schema())
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage.model_extra
    assert usage["x_constrained_tokens"] == completion.usage.completion_tokens and usage["x_mask_ms"] > 0
    assert server.health()["constrained"]["tokens"] >= usage["x_constrained_tokens"]
    alone = engine.generate(QUESTION, max_tokens=160, json_schema=strict_schema())
    assert message.content == alone.text


def test_a_streamed_structured_answer_is_the_same(oa, model):
    streamed = oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=160, stream=True,
                                          response_format={"type": "json_schema", "json_schema": {
                                              "name": "weather", "schema": strict_schema(), "strict": True}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    plain = oa.chat.completions.parse(model=model, messages=QUESTION, response_format=Weather, max_tokens=160)
    assert text == plain.choices[0].message.content


def test_json_object_mode(oa, model, engine):
    completion = oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=160,
                                            response_format={"type": "json_object"}, temperature=0.9, seed=4)
    content = completion.choices[0].message.content
    assert isinstance(json.loads(content), dict)
    alone = engine.generate(QUESTION, max_tokens=160, json_schema=True, temperature=0.9, seed=4)
    assert content == alone.text


def test_responses_parse(oa, model):
    response = oa.responses.parse(model=model, input="What is the weather in Taipei?", text_format=Weather,
                                  max_output_tokens=160)
    assert isinstance(response.output_parsed, Weather)
    jsonschema.validate(json.loads(response.output_text), strict_schema())


def test_anthropic_messages_parse(an, model):
    message = an.messages.parse(model=model, max_tokens=160, messages=QUESTION, output_format=Forecast)
    assert isinstance(message.parsed_output, Forecast)
    jsonschema.validate(json.loads(message.content[0].text), Forecast.model_json_schema())


def test_anthropic_output_config_with_a_schema_of_its_own(an, model):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    message = an.messages.create(model=model, max_tokens=40, messages=QUESTION,
                                 extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    jsonschema.validate(json.loads(message.content[0].text), schema)


@pytest.mark.parametrize("response_format, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}, "json schema cannot be used"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "xml"}, "response_format.type"),
])
def test_a_bad_format_is_a_400_naming_it(oa, model, response_format, words):
    with pytest.raises(openai.BadRequestError, match=words):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, response_format=response_format)


def test_a_format_with_thinking_on_thinks_first(oa, model):
    """The thought first, free (as reasoning_content), then the answer in the format."""
    greeting = [{"role": "user", "content": "Hello there"}]
    completion = oa.chat.completions.parse(model=model, messages=greeting, max_tokens=120, extra_body={"thinking": True},
                                           response_format=Forecast)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Forecast) and message.model_extra["reasoning_content"]


CLOCK = [{"type": "function", "function": {"name": "get_current_time", "description": "The current time in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TIME_QUESTION = [{"role": "user", "content": "What time is it in Taipei? And in New York?"}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_current_time"}}])
def test_a_forced_tool_call_on_chat_completions(oa, model, engine, choice):
    completion = oa.chat.completions.create(model=model, messages=TIME_QUESTION, tools=CLOCK, tool_choice=choice,
                                            max_tokens=120)
    calls = completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "tool_calls" and calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), CLOCK[0]["function"]["parameters"])
    alone = engine.generate(TIME_QUESTION, tools=CLOCK, max_tokens=120,
                            tool_choice=choice if isinstance(choice, str) else "get_current_time")
    assert [json.loads(c.function.arguments) for c in calls] == [c["arguments"] for c in alone.tool_calls]


def test_a_forced_tool_call_on_responses_and_messages(oa, an, model):
    response = oa.responses.create(model=model, input="What time is it in Taipei?", max_output_tokens=120,
                                   tools=[{"type": "function", **CLOCK[0]["function"]}], tool_choice="required")
    assert [item.type for item in response.output if item.type == "function_call"]
    tools = [{"name": "get_current_time", "description": "The current time in a city",
              "input_schema": CLOCK[0]["function"]["parameters"]}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_current_time"}):
        message = an.messages.create(model=model, max_tokens=120, messages=TIME_QUESTION, tools=tools, tool_choice=choice)
        assert message.stop_reason == "tool_use" and [b for b in message.content if b.type == "tool_use"]


def test_a_format_beside_tools_keeps_the_calls(oa, model):
    """response_format with tools: a call, or the answer in the format (the trained model calls)."""
    completion = oa.chat.completions.create(model=model, messages=TIME_QUESTION, tools=CLOCK, max_tokens=120,
                                            response_format={"type": "json_object"})
    assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("api", ["responses", "chat completions"])
def test_the_agents_sdk_with_tools_and_a_typed_output(server, model, api):
    """OpenAI's Agents SDK with `output_type=` and a tool: the model calls the tool (a call is
    still allowed beside the format), then its final answer parses as the type."""
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    asked = []

    @function_tool
    def get_current_time(city: str) -> str:
        """The current time in a city"""
        asked.append(city)
        return "21:04"

    class Answer(BaseModel):
        time: str = Field(max_length=8)

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="clock", model=kind(model=model, openai_client=client), tools=[get_current_time], output_type=Answer)
    result = Runner.run_sync(agent, "What time is it in Taipei? And in New York?", max_turns=4)
    assert isinstance(result.final_output, Answer) and asked == ["Taipei", "New York"]


@pytest.mark.parametrize("schema, words", [
    ({"$ref": "#"}, "gave up"),  # a schema that refers only to itself
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "cannot be used"),
])
def test_hostile_schemas_are_a_quick_400(oa, model, schema, words):
    with pytest.raises(openai.BadRequestError, match=words):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, timeout=30, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_a_schema_nested_past_the_json_limit_is_a_400(oa, model):
    schema = {"type": "integer"}
    for _ in range(80):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(openai.BadRequestError, match="nested"):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


@pytest.mark.parametrize("choice", [{"type": "function", "function": "f"}, {"type": "function", "function": ["f"]},
                                    {"type": "function"}, 3, "sometimes"])
def test_a_malformed_tool_choice_is_a_400(oa, model, choice):
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=5, tools=CLOCK, tool_choice=choice)


def test_a_forced_choice_without_tools_is_a_400_in_every_dialect(oa, an, model):
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        oa.responses.create(model=model, input="Hi", max_output_tokens=5, tool_choice="required")
    with pytest.raises(anthropic.BadRequestError, match="needs tools"):
        an.messages.create(model=model, max_tokens=5, messages=QUESTION, tool_choice={"type": "any"})


class Outlook(BaseModel):
    sky: str = Field(max_length=8)  # (bounded: the tiny model rambles)
    umbrella: bool


def test_pydantic_ai_native_output(server, model):
    """pydantic-ai's NativeOutput (its response_format json_schema, strict) against the server."""
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=server.url + "/v1", api_key=KEY))
    result = Agent(chat, output_type=NativeOutput(Outlook)).run_sync("What is the weather in Taipei?")
    assert isinstance(result.output, Outlook)


def test_langchain_with_structured_output(server, model):
    """langchain-openai's `with_structured_output(method="json_schema")` against the server."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=server.url + "/v1", api_key=KEY, max_tokens=160, max_retries=0)
    answer = llm.with_structured_output(Outlook, method="json_schema").invoke("What is the weather in Taipei?")
    assert isinstance(answer, Outlook)
    jsonschema.validate(answer.model_dump(), Outlook.model_json_schema())
