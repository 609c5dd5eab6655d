"""`mlx-spec serve` under hostile and careless input: every request gets a 4xx with OpenAI's
error object or a right answer, never a 500; a prompt too long for the context holds up no one;
the API describes itself; the model answers to the names agents use. The last test runs an API
fuzzer (schemathesis) against the real server."""

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from serving import ROOT, Server

TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def server(checkpoints):
    s = Server(checkpoints, "--served-model-name", "tiny-gemma", "--served-model-name", "helper", "--max-tokens", "8")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(server, body, path="/v1/chat/completions"):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=60)


def refused(response, *words):
    """A 400 in OpenAI's shape whose message says each of `words` (no exception type in it)."""
    assert response.status_code == 400, (response.status_code, response.text)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert not re.search(r"\b\w+Error\b", error["message"]), error["message"]
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error


def chat(**fields):
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


@pytest.mark.parametrize("tools, where", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": [None, None]}}}],
     "tools[0].function.parameters.properties"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": "AAA"}}}],
     "tools[0].function.parameters.properties"),
    ([{"type": "function", "function": None}], "tools[0].function"),
    ([{"type": "function", "function": False}], "tools[0].function"),
    ([{"type": "function", "function": 0}], "tools[0].function"),
    ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"items": 3}}}}}],
     "tools[0].function.parameters.properties.a.items"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}], "required"),
])
def test_malformed_tools_are_refused(server, tools, where):
    refused(post(server, chat(tools=tools)), where)


def test_deep_nesting_is_refused(server):
    deep = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    error = refused(post(server, deep), "nested deeper than")
    assert error["code"] == "invalid_json"
    nested = {"role": "user", "content": "Hi", "x": json.loads("[" * 70 + "]" * 70)}
    refused(post(server, {"messages": [nested]}), "nested deeper than")


def test_json_nested_deep_inside_strings_is_text_or_a_400(server):
    """JSON a string holds (a call's arguments, a tool's result) is read with the body's bounds:
    each of these was a 500 (the parser's recursion, or the template's rendering the value)."""
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    nested = '{"a":' * 200 + "1" + "}" * 200
    user = {"role": "user", "content": "Hi"}
    ok = post(server, chat(messages=[user, call, {"role": "tool", "tool_call_id": "c", "content": nested}], tools=[TOOL]))
    assert ok.status_code == 200, ok.text  # the result as the text it is
    deep_call = {**call, "tool_calls": [{**call["tool_calls"][0], "function": {"name": "get_time", "arguments": "[" * 100_000}}]}
    refused(post(server, chat(messages=[user, deep_call], tools=[TOOL])), "nested deeper than 64")
    tool_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_time", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": nested}]}
    answer = post(server, {"model": "tiny-gemma", "max_tokens": 4, "messages": [user, tool_use, result]}, "/v1/messages")
    assert answer.status_code == 200, answer.text
    for item in ({"type": "message", "role": ["user"], "content": "x"}, {"type": "reasoning", "content": 5},
                 {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 100_000}):
        r = post(server, {"model": "tiny-gemma", "input": [{"role": "user", "content": "Hi"}, item]}, "/v1/responses")
        assert r.status_code == 400 and r.json()["error"]["message"], r.text


def test_a_lone_surrogate_is_refused(server):
    body = '{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":4}'
    refused(post(server, body), "lone surrogate", "messages[0].content")


@pytest.mark.parametrize("body, words", [
    ('{"messages":[{"role":"user","content":"Hi"}],"temperature":Infinity}', ["finite"]),
    ('{"messages":[{"role":"user","content":"Hi"}],"temperature":NaN}', ["finite"]),
    ('{"messages":[{"role":"user","content":"Hi"}],"temperature":1e400}', ["finite"]),
    ('{"messages":[{"role":"user","content":"Hi"}],"top_k":1000000000}', ["top_k", "vocabulary"]),
])
def test_out_of_range_numbers_are_refused(server, body, words):
    refused(post(server, body), *words)


def test_tool_results_must_answer_a_call(server, client):
    user = {"role": "user", "content": "What time is it?"}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    orphan = [user, {"role": "tool", "tool_call_id": "call_1", "content": "21:04"}]
    refused(post(server, chat(messages=orphan, tools=[TOOL])), "messages[1]", "must follow an assistant message")
    wrong_id = [user, call, {"role": "tool", "tool_call_id": "call_9", "content": "21:04"}]
    refused(post(server, chat(messages=wrong_id, tools=[TOOL])), "call_9", "call_1")
    too_many = [user, call, {"role": "tool", "content": "21:04"}, {"role": "tool", "content": "08:04"}]
    refused(post(server, chat(messages=too_many, tools=[TOOL])), "more tool results")
    right = [user, call, {"role": "tool", "tool_call_id": "call_1", "content": "21:04"}]
    assert client.chat.completions.create(model="tiny-gemma", messages=right, tools=[TOOL], max_tokens=4).choices


def test_a_prompt_too_long_is_refused_before_the_model_thread(server, client):
    """10 MB of text is refused by its length alone (no tokenizing: the message says "at least"),
    and a prompt just over the context after tokenizing; neither reaches the model's thread
    (its count of requests served does not move), and the next request is answered."""
    served = server.health()["served"]
    big = post(server, chat(messages=[{"role": "user", "content": "word " * 2_000_000}]))
    error = refused(big, "at least", "maximum context length")
    assert error["code"] == "context_length_exceeded"
    over = post(server, chat(messages=[{"role": "user", "content": "Hi " * 4100}]))
    error = refused(over, "maximum context length")
    assert "at least" not in error["message"] and error["code"] == "context_length_exceeded"
    assert "4 in the completion" in error["message"]
    # Messages and Responses take max_tokens as a ceiling: only the prompt failed to fit, and the
    # words asked Claude Code to reduce its 32,000-token completion too (found by a review).
    for path, body in (("/v1/messages", {"model": "tiny-gemma", "max_tokens": 32000,
                                         "messages": [{"role": "user", "content": "Hi " * 4100}]}),
                       ("/v1/responses", {"model": "tiny-gemma", "max_output_tokens": 32000, "input": "Hi " * 4100})):
        answer = post(server, body, path)
        assert answer.status_code == 400, answer.text
        words = json.dumps(answer.json())
        assert "your messages resulted in" in words and "completion" not in words, words
    assert server.health()["served"] == served
    assert client.chat.completions.create(model="tiny-gemma", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3).choices[0].finish_reason


def test_the_length_bound_never_refuses_a_prompt_that_fits(checkpoints):
    """A text of n characters is at least n / longest_token_chars tokens, on texts of every kind
    of character (the bound the server refuses by is twice as loose)."""
    from hypothesis import given, settings, strategies as st

    from mlx_spec import load

    engine = load(str(checkpoints["text"]), drafter=None)
    longest = engine.text.longest_token_chars
    assert longest >= 1

    @settings(max_examples=300, deadline=None)
    @given(st.text(min_size=1, max_size=400) | st.from_regex(r"( {1,40}|a{1,60}|\n{1,20}|[0-9]{1,30})+", fullmatch=True))
    def check(text):
        assert len(engine.encode(text)) * longest >= len(text)

    check()


def readme_routes():
    section = (ROOT / "README.md").read_text().split("## Serve", 1)[1].split("\n## ", 1)[0]
    # The description itself is the one route it does not list.
    return set(re.findall(r"`(GET|POST) (/[^`\s]*)`", section)) - {("GET", "/openapi.json")}


def test_the_api_describes_every_route_the_readme_lists(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    routes = readme_routes()
    assert len(routes) >= 5
    for method, path in routes:
        assert method.lower() in spec["paths"].get(path, {}), (method, path)
    for path in ("/v1/chat/completions", "/v1/completions"):
        schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "messages" in schema["properties"] or "prompt" in schema["properties"]
        assert spec["paths"][path]["post"]["responses"]["400"]["content"]


def test_the_model_answers_to_its_served_names(server, client, checkpoints):
    listed = [m.id for m in client.models.list().data]
    assert listed == ["tiny-gemma", "helper"]
    folder = str(checkpoints["text"])
    for name in ("tiny-gemma", "helper", folder, Path(folder).name):
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert reply.model == "tiny-gemma"
        assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError, match="tiny-gemma"):
        client.chat.completions.create(model="gemma-4-e2b", messages=[{"role": "user", "content": "Hi"}])


def test_the_family_short_name_is_accepted_for_its_size():
    from mlx_spec.models.gemma4.sizes import SIZES as FAMILY
    from mlx_spec.server.names import ModelNames

    names = ModelNames("mlx-community/gemma-4-e2b-it-4bit")
    assert "e2b" in names and "gemma-4-e2b-it-4bit" in names and "e4b" not in names

    class Args:  # a folder of the E4B structure, found by its config
        def __init__(self, text):
            self.__dict__.update(text)

    from types import SimpleNamespace

    from mlx_spec.models import GEMMA4

    target = SimpleNamespace(args=Args(FAMILY["e4b"].text))
    engine = SimpleNamespace(pair=SimpleNamespace(size_name=GEMMA4.size_of(target)))
    names = ModelNames("/models/my-e4b-finetune", ["mine"], engine)
    assert names.id == "mine" and "e4b" in names and "my-e4b-finetune" in names and "e2b" not in names


def test_an_api_fuzzer_finds_no_server_error(server, client, tmp_path):
    """schemathesis over the API description, coverage phase on: no 5xx, every response as
    described, and greedy answers unchanged afterwards."""
    ask = [{"role": "user", "content": "Tell me a story"}]
    before = client.chat.completions.create(model="tiny-gemma", messages=ask, max_tokens=12, temperature=0)
    fuzzer = "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"  # its command, this Python
    command = [sys.executable, "-c", fuzzer,
               "run", server.url + "/openapi.json", "--phases", "examples,coverage,fuzzing",
               "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
               "--max-examples", "25", "--seed", "1", "--workers", "1", "--request-timeout", "60",
               "--generation-database", "none", "--no-color", "--max-time", "100"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
    after = client.chat.completions.create(model="tiny-gemma", messages=ask, max_tokens=12, temperature=0)
    assert after.choices[0].message.content == before.choices[0].message.content
    assert server.health()["running"] == 0


@pytest.mark.parametrize("body, words", [
    (chat(temperature=1e-31), ["temperature"]),  # refused by the sampling settings, not the schema
    (chat(messages=[{"role": "assistant", "content": "x", "tool_calls": 5}, {"role": "user", "content": "Hi"}]),
     ["messages[0].tool_calls must be a list"]),
    (chat(stop=[f"stop {i}" for i in range(17)]), ["at most 16 stop strings"]),
    (chat(stop="x" * 1001), ["at most 1000 characters"]),
])
def test_settings_refused_past_the_schema_are_400s(server, body, words):
    """Each was a 500 (a second review of the server): a temperature the engine refuses below the
    smallest it can sample at, calls that are not a list, and stop strings past what a token's
    matching can afford on the model's thread (200,000 of them stalled every row)."""
    refused(post(server, body), *words)


def test_the_other_dialects_refuse_what_they_cannot_read_and_name_any_tool_type(server):
    """`text.format` as a string was a 500 on /v1/responses; a tool type outside Latin-1 was a
    500 after the whole answer was made (a header cannot hold it), and streamed, it left the
    answer decoding for nobody. It is now named percent-encoded."""
    refused(post(server, {"input": "hi", "max_output_tokens": 4, "text": {"format": "json_object"}}, "/v1/responses"),
            "text.format must be an object")
    for stream in (False, True):
        for path, body, named in [
            ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [{"type": "€ search"}]}, "%E2%82%AC%20search"),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [{"type": " web"}, {"type": ""}]}, "%20web"),
            ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "工具\r\nx-evil: 1"}]}, "%E5%B7%A5%E5%85%B7%0D%0Ax-evil:%201")]:
            response = post(server, {**body, "stream": stream}, path)
            assert response.status_code == 200, response.text
            assert response.headers["x-mlx-spec-ignored-tools"] == named and "x-evil" not in response.headers
    server.wait_idle(timeout=30)  # (the streamed answers ended with their streams)


def test_routes_agents_and_checks_call(server):
    """HEAD /health for liveness checks, `/v1/models/` (a base URL joined with a slash) for the
    list, and a 405 that says which methods are allowed."""
    head = httpx.head(server.url + "/health", timeout=30)
    assert head.status_code == 200 and head.content == b""
    listed = httpx.get(server.url + "/v1/models/", timeout=30)
    assert listed.status_code == 200 and listed.json() == httpx.get(server.url + "/v1/models", timeout=30).json()
    wrong = httpx.delete(server.url + "/v1/chat/completions", timeout=30)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()  # one operation id each, HEAD left out
    ids = [operation["operationId"] for path in spec["paths"].values() for operation in path.values()]
    assert len(ids) == len(set(ids)) and set(spec["paths"]["/health"]) == {"get"}
