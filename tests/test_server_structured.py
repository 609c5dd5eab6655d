"""Structured outputs through the official clients' own helpers, against a real `mlx-spec serve`:
OpenAI's `chat.completions.parse` and `responses.parse` with a pydantic model, `json_object`,
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


def test_chat_parse_with_a_pydantic_model(oa, model, engine):
    completion = oa.chat.completions.parse(model=model, messages=QUESTION, response_format=Weather, max_tokens=160)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Weather)
    jsonschema.validate(json.loads(message.content), strict_schema())
    assert completion.choices[0].finish_reason == "stop"
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


def test_a_format_with_tools_is_refused_by_name(oa, model):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(openai.BadRequestError, match="response_format with tools"):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, tools=tools,
                                   response_format={"type": "json_object"})


def test_a_format_with_thinking_asked_for_is_refused_by_name(oa, model):
    with pytest.raises(openai.BadRequestError, match="turn thinking off"):
        oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, extra_body={"thinking": True},
                                   response_format={"type": "json_object"})
