"""OpenAI's Responses API and Anthropic's Messages API, through their official clients and
OpenAI's Agents SDK, against a real `mlx-spec serve` of the tiny target trained to speak
Gemma 4's chat format (tests/chat_script.py): tool calls and their results round trip, streams
end as the plain answers do, greedy answers equal `Engine.generate`'s token for token, a
continued conversation resumes the prompt cache, and errors come as each client's own types.
(The real Codex CLI and Claude Code: tests/test_agents.py.)"""

import json

import anthropic
import httpx
import openai
import pytest
from chat_script import ANSWER, GREETING, HELLO, QUESTION, THOUGHT
from chat_script import TOOLS as CLOCK

from mlx_spec import load
from serving import Server

KEY = "sk-dialects"
PARAMETERS = CLOCK[0]["function"]["parameters"]
RESPONSES_CLOCK = [{"type": "function", "name": "get_current_time", "description": "The current time in a city",
                    "parameters": PARAMETERS}]
MESSAGES_CLOCK = [{"name": "get_current_time", "description": "The current time in a city", "input_schema": PARAMETERS}]
# What the tools return, as the clients send it: a JSON object, which the server renders natively
# as the engine renders chat_script.RESULTS' mapping, and a plain string.
TIMES = {"Taipei": '{"time": "21:04"}', "New York": "08:04"}


@pytest.fixture(scope="module")
def server(trained, checkpoints):
    s = Server({"text": trained, "assistant": checkpoints["assistant"]}, "--api-key", KEY, "--max-tokens", "200")
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


def ask(text):
    return [{"role": "user", "content": text}]


def ids(reports):
    return [t["token"] if isinstance(t, dict) else t.token for t in reports]


def chat_calls(calls):
    """OpenAI chat tool calls for (call_id, name, arguments) triples, as the engine's conversation has them."""
    return [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]


def tool_results(calls):
    """The tool messages the engine takes for those calls' results (chat_script.RESULTS)."""
    return [{"role": "tool", "tool_call_id": i, "content": json.loads(TIMES[a["city"]]) if a["city"] == "Taipei" else TIMES[a["city"]]}
            for i, _, a in calls]


# --- OpenAI's Responses API -------------------------------------------------------------------


def test_responses_tool_call_round_trip(oa, model, engine):
    """responses.create with a function tool: the calls come back as function_call items; their
    outputs go back as function_call_output items beside them, and the answer from them equals
    the engine's for the same conversation, with the first turn's prompt resumed."""
    first = oa.responses.create(model=model, input=QUESTION, tools=RESPONSES_CLOCK, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_current_time", {"city": "Taipei"}), ("get_current_time", {"city": "New York"})]
    assert first.status == "completed" and first.output_text == "" and len({c.call_id for c in calls}) == 2
    expected_calls = engine.generate(ask(QUESTION), tools=CLOCK, max_tokens=200).tool_calls
    assert [(c["name"], c["arguments"]) for c in expected_calls] == [(c.name, json.loads(c.arguments)) for c in calls]
    triples = [(c.call_id, c.name, json.loads(c.arguments)) for c in calls]
    follow = [{"type": "message", "role": "user", "content": QUESTION}, *[c.model_dump(exclude_none=True) for c in calls],
              *[{"type": "function_call_output", "call_id": i, "output": TIMES[a["city"]]} for i, _, a in triples]]
    second = oa.responses.create(model=model, input=follow, tools=RESPONSES_CLOCK, temperature=0)
    conversation = ask(QUESTION) + [{"role": "assistant", "content": "", "tool_calls": chat_calls(triples)}] + tool_results(triples)
    expected = engine.generate(conversation, tools=CLOCK, max_tokens=200)
    assert second.output_text == expected.text == ANSWER
    assert second.usage.input_tokens == len(engine.encode(conversation, CLOCK))
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 12


def plain_items(response):
    """A response's output without the ids two answers do not share (and the fields the
    client's stream helper adds, None here)."""
    return [item.model_dump(exclude={"id", "call_id"}, exclude_none=True) for item in response.output]


@pytest.mark.parametrize("prompt, tools, reasoning", [(QUESTION, RESPONSES_CLOCK, None), (GREETING, None, {"effort": "low"})])
def test_responses_stream_ends_as_the_plain_answer(oa, model, prompt, tools, reasoning):
    """responses.stream: the final response equals the plain one; text and argument deltas
    assemble to the plain text and calls; a thought streams as a reasoning item."""
    extra = {k: v for k, v in {"tools": tools, "reasoning": reasoning}.items() if v}
    plain = oa.responses.create(model=model, input=prompt, temperature=0, **extra)
    deltas, arguments, kinds = [], {}, []
    with oa.responses.stream(model=model, input=prompt, temperature=0, **extra) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.function_call_arguments.delta":
                arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
        final = stream.get_final_response()
    assert plain_items(final) == plain_items(plain)
    assert final.output_text == plain.output_text == "".join(deltas)
    assert [arguments[c.id] for c in final.output if c.type == "function_call"] == [
        c.arguments for c in plain.output if c.type == "function_call"]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    opened = [e for e in kinds if e.endswith(".added")]
    assert opened[0] == "response.output_item.added"
    assert opened.count("response.output_item.added") == len(final.output) == kinds.count("response.output_item.done")
    if reasoning:
        assert [i.type for i in plain.output] == ["reasoning", "message"]
        assert plain.output[0].content[0].text == THOUGHT and plain.output_text == HELLO


def test_responses_answers_equal_generate_token_for_token(oa, model, engine, server):
    """Greedy, streamed and not, the per-token reports' tokens are the engine's; a reasoning
    item's thought and the message are the engine's thought and text."""
    expected = engine.generate(ask(GREETING), thinking=True, max_tokens=60)
    body = {"model": model, "input": GREETING, "reasoning": {"effort": "medium"}, "max_output_tokens": 60,
            "temperature": 0, "x_report": True}
    plain = oa.responses.create(**body_args(body))
    assert ids(plain.model_extra["x_tokens"]) == expected.tokens
    assert (plain.output[0].content[0].text, plain.output_text) == (expected.thinking, expected.text)
    streamed = []
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                streamed += event.get("x_tokens", []) if event["type"].endswith(".delta") else []
                if event["type"] == "response.completed":
                    assert ids(event["response"]["x_tokens"]) == expected.tokens
    shown = [t for t in expected.steps if t.text and t.channel in ("answer", "thought")]
    assert ids(streamed) == [t.token for t in shown]


def body_args(body):
    """The openai client's arguments for a body with mlx-spec's extensions."""
    known = {k: v for k, v in body.items() if k != "x_report"}
    return {**known, "extra_body": {"x_report": body["x_report"]}} if "x_report" in body else known


def test_responses_refuses_what_it_cannot_honour(oa, model):
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
        oa.responses.create(model=model, input="Hi", previous_response_id="resp_123")
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        oa.responses.create(model=model, input="Hi", tools=RESPONSES_CLOCK, tool_choice={"type": "function", "name": "f"})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.responses.create(model="gpt-9", input="Hi")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=oa.base_url, api_key="wrong", max_retries=0).responses.create(model=model, input="Hi")


def test_responses_leaves_out_tools_it_cannot_run(oa, model, engine, server):
    """Codex sends web_search, local_shell, custom and namespace tools with every request:
    they are left out of the prompt and named in a header, and the function tools still work."""
    tools = [*RESPONSES_CLOCK, {"type": "web_search"}, {"type": "local_shell"},
             {"type": "custom", "name": "apply_patch", "description": "Patch files"},
             {"type": "namespace", "name": "multi_agent_v1", "tools": []}]
    raw = oa.responses.with_raw_response.create(model=model, input=QUESTION, tools=tools, temperature=0, max_output_tokens=1)
    assert raw.headers["x-mlx-spec-ignored-tools"] == "web_search, local_shell, custom, namespace"
    probe = raw.parse()  # Codex's probe: one token
    assert probe.status == "incomplete" and probe.incomplete_details.reason == "max_output_tokens"
    # Its message is marked cut off too, as OpenAI marks it, whole and streamed.
    assert [item.status for item in probe.output if item.type == "message"] == ["incomplete"]
    events = list(oa.responses.create(model=model, input=QUESTION, tools=tools, temperature=0, max_output_tokens=1,
                                      stream=True))
    assert events[-1].type == "response.incomplete"
    assert [item.status for item in events[-1].response.output if item.type == "message"] == ["incomplete"]
    assert probe.usage.input_tokens == len(engine.encode(ask(QUESTION), CLOCK))
    assert oa.models.list().data[0].model_extra["context_window"] == engine.context_length


def test_the_agents_sdk_runs_a_tool_round_trip(server, model):
    """OpenAI's Agents SDK, its default OpenAIResponsesModel: the model calls the tool twice,
    the SDK runs it and sends the results, and the final output is the trained answer."""
    agents = pytest.importorskip("agents", reason="the openai-agents package is in the test extra")
    seen = []

    async def get_current_time(context, arguments: str) -> str:
        city = json.loads(arguments)["city"]
        seen.append(city)
        return TIMES[city]

    tool = agents.FunctionTool(name="get_current_time", description="The current time in a city",
                               params_json_schema=PARAMETERS, on_invoke_tool=get_current_time, strict_json_schema=False)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    agent = agents.Agent(name="clock", tools=[tool], model=agents.OpenAIResponsesModel(model=model, openai_client=client),
                         model_settings=agents.ModelSettings(temperature=0))
    result = agents.Runner.run_sync(agent, QUESTION, run_config=agents.RunConfig(tracing_disabled=True))
    assert seen == ["Taipei", "New York"]
    assert result.final_output == ANSWER


# --- Anthropic's Messages API ------------------------------------------------------------------


def test_messages_tool_use_round_trip(an, model, engine):
    """messages.create with a tool: tool_use blocks and stop_reason "tool_use"; the tool_result
    blocks go back in a user turn, and the answer equals the engine's, the prompt resumed."""
    first = an.messages.create(model=model, max_tokens=200, messages=ask(QUESTION), tools=MESSAGES_CLOCK)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and [(u.name, u.input) for u in uses] == [
        ("get_current_time", {"city": "Taipei"}), ("get_current_time", {"city": "New York"})]
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": TIMES[u.input["city"]]} for u in uses]
    follow = ask(QUESTION) + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                              {"role": "user", "content": results}]
    second = an.messages.create(model=model, max_tokens=200, messages=follow, tools=MESSAGES_CLOCK)
    triples = [(u.id, u.name, u.input) for u in uses]
    conversation = ask(QUESTION) + [{"role": "assistant", "content": "", "tool_calls": chat_calls(triples)}] + tool_results(triples)
    expected = engine.generate(conversation, tools=CLOCK, max_tokens=200)
    assert [b.type for b in second.content] == ["text"] and second.content[0].text == expected.text == ANSWER
    assert second.stop_reason == "end_turn"
    usage = second.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(engine.encode(conversation, CLOCK))
    assert usage.cache_read_input_tokens >= first.usage.input_tokens - 12


@pytest.mark.parametrize("prompt, tools, thinking", [
    (QUESTION, MESSAGES_CLOCK, None), (GREETING, None, {"type": "enabled", "budget_tokens": 1024})])
def test_messages_stream_ends_as_the_plain_answer(an, model, prompt, tools, thinking):
    extra = {k: v for k, v in {"tools": tools, "thinking": thinking}.items() if v}
    plain = an.messages.create(model=model, max_tokens=200, messages=ask(prompt), **extra)
    with an.messages.stream(model=model, max_tokens=200, messages=ask(prompt), **extra) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert without_ids(final) == without_ids(plain)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    if thinking:
        assert [(b.type, getattr(b, "thinking", None) or b.text) for b in plain.content] == [
            ("thinking", THOUGHT), ("text", HELLO)]


def without_ids(message):
    """A message but its ids, and its usage's split of the prompt into cached and not (the
    second of two requests may resume more of the first's sequence than the first did of
    whatever came before it)."""
    out = message.model_dump(exclude={"id"})
    out["content"] = [{k: v for k, v in block.items() if k != "id"} for block in out["content"]]
    usage = out.pop("usage")
    out["prompt_tokens"] = usage["input_tokens"] + usage["cache_read_input_tokens"]
    out["output_tokens"] = usage["output_tokens"]
    return out


def test_messages_answers_equal_generate_token_for_token(an, model, engine, server):
    expected = engine.generate(ask(GREETING), thinking=True, max_tokens=60)
    body = {"model": model, "max_tokens": 60, "messages": ask(GREETING), "thinking": {"type": "enabled"}, "x_report": True}
    plain = an.messages.create(**{k: v for k, v in body.items() if k != "x_report"}, extra_body={"x_report": True})
    assert ids(plain.model_extra["x_tokens"]) == expected.tokens
    assert [b.thinking if b.type == "thinking" else b.text for b in plain.content] == [expected.thinking, expected.text]
    streamed = []
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True}, headers={"x-api-key": KEY},
                      timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                streamed += json.loads(line[6:]).get("x_tokens", [])
    shown = [t for t in expected.steps if t.text and t.channel in ("answer", "thought")]
    assert ids(streamed) == [t.token for t in shown]


def test_a_seeded_messages_sample_is_the_one_generate_gives(an, model, engine):
    """`seed` is an extension here as on chat completions (found by a review: the Messages route
    dropped it, so no sampled answer could be had again)."""
    expected = engine.generate(ask(GREETING), temperature=1.0, seed=5, thinking=False, max_tokens=40)
    for _ in range(2):
        reply = an.messages.create(model=model, max_tokens=40, messages=ask(GREETING), thinking={"type": "disabled"},
                                   extra_body={"temperature": 1.0, "seed": 5, "x_report": True})
        assert ids(reply.model_extra["x_tokens"]) == expected.tokens


def test_stop_sequences_end_the_answer(an, model, engine):
    thinking = {"type": "enabled"}
    reply = an.messages.create(model=model, max_tokens=200, messages=ask(GREETING), stop_sequences=["help"], thinking=thinking)
    full = engine.generate(ask(GREETING), thinking=True, max_tokens=200).text
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "help"
    assert [b.type for b in reply.content] == ["thinking", "text"] and reply.content[1].text == full[: full.index("help")]
    short = an.messages.create(model=model, max_tokens=3, messages=ask(GREETING))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_count_tokens_counts_the_rendered_prompt(an, model, engine):
    conversation = [{"role": "user", "content": QUESTION}]
    counted = an.messages.count_tokens(model=model, messages=conversation, tools=MESSAGES_CLOCK, system="Be brief.")
    assert counted.input_tokens == len(engine.encode([{"role": "system", "content": "Be brief."}, *conversation], CLOCK))


def test_messages_errors_are_the_clients_own_types(an, model, server):
    """Anthropic's envelope and status codes, raised as the client's exception types."""
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=model, max_tokens=5, messages=ask("Hi"))
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        an.messages.create(model="claude-opus-9", max_tokens=5, messages=ask("Hi"))
    with pytest.raises(anthropic.BadRequestError, match="not among the tools"):
        an.messages.create(model=model, max_tokens=5, messages=ask("Hi"), tools=MESSAGES_CLOCK,
                           tool_choice={"type": "tool", "name": "Bash"})
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        an.messages.create(model=model, max_tokens=0, messages=ask("Hi"))
    missing = httpx.post(server.url + "/v1/messages", json={"model": model, "messages": ask("Hi")},
                         headers={"x-api-key": KEY})
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in missing.json()["error"]["message"]
    unknown = httpx.post(server.url + "/v1/messages/nothing", json={}, headers={"x-api-key": KEY})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    bearer = httpx.post(server.url + "/v1/messages?beta=true", json={"model": model, "max_tokens": 2, "messages": ask("Hi")},
                        headers={"Authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"})
    assert bearer.status_code == 200 and bearer.json()["usage"]["output_tokens"] == 2


def test_an_image_a_tool_returns_to_a_text_only_model_is_a_note_and_the_session_goes_on(oa, an, model, engine):
    """Codex's view_image and Claude Code's Read return an image in a tool's output. Refused on a
    model without a vision tower, every later turn of the session was refused too (each sends it
    again). It is read as a note in its place, as `Engine.generate` reads the same turn; an image
    the user sends is still a 400 naming its place."""
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    note = "[a tool returned an image here; this model takes no image input]"
    call = {"id": "t1", "type": "function", "function": {"name": "get_current_time", "arguments": {"city": "Taipei"}}}
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "21:04"},
            {"role": "user", "content": [{"type": "text", "text": note}]}]
    expected = engine.generate(chat, tools=CLOCK, max_tokens=20)

    response = oa.responses.create(model=model, max_output_tokens=20, temperature=0, tools=RESPONSES_CLOCK, input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": "t1", "name": "get_current_time", "arguments": '{"city": "Taipei"}'},
        {"type": "function_call_output", "call_id": "t1", "output": [
            {"type": "input_text", "text": "21:04"}, {"type": "input_image", "image_url": "data:image/png;base64," + png}]}])
    assert response.output_text == expected.text and response.usage.input_tokens == len(engine.encode(chat, CLOCK))

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    message = an.messages.create(model=model, max_tokens=20, tools=MESSAGES_CLOCK, messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_current_time", "input": {"city": "Taipei"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "21:04"}, image]}]}])
    assert "".join(b.text for b in message.content if b.type == "text") == expected.text

    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\].*no image or audio input"):
        an.messages.create(model=model, max_tokens=20, messages=[{"role": "user", "content": [image]}])
