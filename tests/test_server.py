"""`mlx-spec serve` as a real process on the tiny checkpoints, through the official `openai`
client: answers equal `Engine.generate`'s token for token, errors are the client's own types."""

import json
import math
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from mlx_spec import load
from serving import Server

KEY = "sk-test-key"
TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "The current time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(checkpoints):
    s = Server(checkpoints, "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def engine(checkpoints):
    """The same checkpoints in-process, stop tokens included, as the server loads them."""
    return load(str(checkpoints["text"]), str(checkpoints["assistant"]))


def ask(text):
    return [{"role": "user", "content": text}]


def ids(tokens):
    return [t["token"] for t in tokens]


def test_chat_equals_generate_token_for_token(client, model, engine):
    for question, limit in [("Hello there", 40), ("Tell me a story", 60)]:
        expected = engine.generate(ask(question), max_tokens=limit)
        reply = client.chat.completions.create(model=model, messages=ask(question), max_tokens=limit,
                                               temperature=0, extra_body={"x_report": True})
        choice = reply.choices[0]
        assert ids(choice.x_tokens) == expected.tokens
        assert choice.message.content == expected.text and choice.finish_reason == expected.finish_reason
        assert reply.usage.prompt_tokens == len(engine.encode(ask(question)))
        assert reply.usage.completion_tokens == len(expected.tokens)
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        assert reply.usage.x_kept <= reply.usage.x_drafted
        for t, step in zip(choice.x_tokens, expected.steps):
            assert t["prob"] == pytest.approx(step.prob, rel=1e-5) and t["rank"] == step.rank
            assert set(t) >= {"prob", "rank", "sampling_prob", "candidates", "top", "drafted", "channel", "text"}


def test_streaming_chat_equals_generate(client, model, engine):
    expected = engine.generate(ask("Hello there"), max_tokens=50)
    chunks = list(client.chat.completions.create(
        model=model, messages=ask("Hello there"), max_tokens=50, stream=True,
        stream_options={"include_usage": True}, extra_body={"x_report": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [t["token"] for c in chunks if c.choices for t in (c.choices[0].model_extra.get("x_tokens") or [])]
    assert text == expected.text and tokens == expected.tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [expected.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.tokens)


def test_sampling_settings_and_mtp_off_reach_the_engine(client, model, engine):
    expected = engine.generate(ask("Why?"), max_tokens=30, temperature=0.8, top_k=20, top_p=0.9, seed=7)
    reply = client.chat.completions.create(model=model, messages=ask("Why?"), max_tokens=30, temperature=0.8,
                                           top_p=0.9, seed=7, extra_body={"top_k": 20, "x_report": True})
    assert ids(reply.choices[0].x_tokens) == expected.tokens
    assert all(1 <= t["candidates"] <= 20 for t in reply.choices[0].x_tokens)
    plain = client.chat.completions.create(model=model, messages=ask("Why?"), max_tokens=30,
                                           extra_body={"mtp": False, "x_report": True})
    assert ids(plain.choices[0].x_tokens) == engine.generate(ask("Why?"), max_tokens=30).tokens
    assert plain.usage.x_drafted == 0


def test_logprobs_come_from_the_reports(client, model, engine):
    expected = engine.generate(ask("Hello there"), max_tokens=20)
    reply = client.chat.completions.create(model=model, messages=ask("Hello there"), max_tokens=20,
                                           logprobs=True, top_logprobs=5)
    content = reply.choices[0].logprobs.content
    shown = [s for s in expected.steps if s.token not in engine.stop_tokens]
    assert len(content) == len(shown) > 0
    for entry, step in zip(content, shown):
        assert entry.token == engine.text.token_text(step.token)
        assert entry.bytes == list(engine.text.token_bytes(step.token))
        assert [t.bytes for t in entry.top_logprobs] == [list(engine.text.token_bytes(i)) for i, _, _ in step.top]
        assert entry.logprob == pytest.approx(math.log(step.prob), abs=1e-5)
        assert [t.token for t in entry.top_logprobs] == [t for _, _, t in step.top]
        assert [t.logprob for t in entry.top_logprobs] == sorted([t.logprob for t in entry.top_logprobs], reverse=True)
    streamed = client.chat.completions.create(model=model, messages=ask("Hello there"), max_tokens=20,
                                              logprobs=True, top_logprobs=2, stream=True)
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in content])
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_completions_for_raw_prompts(client, model, engine):
    expected = engine.generate("The quick brown fox", max_tokens=25)
    reply = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=25, logprobs=3,
                                      extra_body={"x_report": True})
    choice = reply.choices[0]
    assert ids(choice.x_tokens) == expected.tokens
    assert choice.text == "".join(s.text for s in expected.steps)
    assert len(choice.logprobs.tokens) == len([t for t in expected.tokens if t not in engine.stop_tokens])
    assert all(len(top) <= 3 for top in choice.logprobs.top_logprobs)
    streamed = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=25, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    by_ids = client.completions.create(model=model, prompt=engine.encode("The quick brown fox"), max_tokens=25)
    assert by_ids.choices[0].text == choice.text


def test_stop_strings_end_the_answer_and_are_left_out(client, model, engine):
    full = engine.generate(ask("Hello there"), max_tokens=40).text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = full[: full.index(stop)]
    reply = client.chat.completions.create(model=model, messages=ask("Hello there"), max_tokens=40, stop=[stop, "zzzz"])
    assert reply.choices[0].message.content == cut and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 40
    chunks = list(client.chat.completions.create(model=model, messages=ask("Hello there"), max_tokens=40, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_thinking_switch(client, model, engine):
    expected = engine.generate(ask("Hi"), max_tokens=30, thinking=True)
    for extra in ({"thinking": True}, {"chat_template_kwargs": {"enable_thinking": True}}):
        reply = client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=30,
                                               extra_body={**extra, "x_report": True})
        assert reply.usage.prompt_tokens == len(engine.encode(ask("Hi"), thinking=True))
        assert ids(reply.choices[0].x_tokens) == expected.tokens
        assert (reply.choices[0].message.model_extra.get("reasoning_content") or "") == expected.thinking
    assert len(engine.encode(ask("Hi"), thinking=True)) != len(engine.encode(ask("Hi")))


def test_tools_are_rendered_and_tool_results_answered(client, model, engine):
    reply = client.chat.completions.create(model=model, messages=ask("What time is it in Taipei?"), tools=TOOLS,
                                           max_tokens=20, extra_body={"x_report": True})
    assert reply.usage.prompt_tokens == len(engine.encode(ask("What time is it in Taipei?"), tools=TOOLS))
    assert ids(reply.choices[0].x_tokens) == engine.generate(ask("What time is it in Taipei?"), tools=TOOLS, max_tokens=20).tokens
    none = client.chat.completions.create(model=model, messages=ask("What time is it in Taipei?"), tools=TOOLS,
                                          tool_choice="none", max_tokens=5)
    assert none.usage.prompt_tokens == len(engine.encode(ask("What time is it in Taipei?")))
    # A round trip as an agent sends it: the call (arguments as a JSON string) and its result.
    openai_style = ask("What time is it in Taipei?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_time", "arguments": json.dumps({"city": "Taipei"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"time": "21:04"})},
    ]
    native = ask("What time is it in Taipei?") + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_time", "arguments": {"city": "Taipei"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": {"time": "21:04"}},
    ]
    rendered = engine.tokenizer.decode(engine.encode(native, tools=TOOLS))
    assert '<|tool_call>call:get_time{city:<|"|>Taipei<|"|>}<tool_call|>' in rendered
    assert '<|tool_response>response:get_time{time:<|"|>21:04<|"|>}<tool_response|>' in rendered
    expected = engine.generate(native, tools=TOOLS, max_tokens=20)
    reply = client.chat.completions.create(model=model, messages=openai_style, tools=TOOLS, max_tokens=20,
                                           extra_body={"x_report": True})
    assert reply.usage.prompt_tokens == len(engine.encode(native, tools=TOOLS))
    assert ids(reply.choices[0].x_tokens) == expected.tokens
    assert reply.choices[0].message.content == expected.text


def test_errors_are_the_clients_own_types(server, client, model):
    cases = [  # (the request, what its error must name)
        (dict(temperature=-1.0), "temperature"), (dict(top_p=1.5), "top_p"), (dict(max_tokens=5000), "context length"),
        (dict(top_logprobs=6, logprobs=True), "top_logprobs"), (dict(n=2), "n"),
        (dict(extra_body={"top_k": "many"}), "top_k"), (dict(tool_choice="required"), "needs tools"),
    ]
    for bad, named in cases:
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model=model, messages=ask("Hi"), **{"max_tokens": 5, **bad})
        body = raised.value.body
        assert raised.value.status_code == 400 and (named in body["message"] or body.get("param") == named), (bad, body)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model=model, messages=ask("Hi " * 3000), max_tokens=5)
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-4", messages=ask("Hi"))
    assert raised.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    headers = {"Authorization": f"Bearer {KEY}"}
    for body, status in [(b'{"messages": [', 400), (b"[1, 2]", 400), (b'{"messages": "hi"}', 400)]:
        r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.post(server.url + "/v1/chat/completions", json={"messages": ask("Hi")}).status_code == 401
    assert httpx.get(server.url + "/v1/nothing", headers=headers).json()["error"]["code"] == "not_found"
    big = httpx.post(server.url + "/v1/chat/completions", content=b"x" * (17 * 2**20), headers=headers)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(server.url + "/v1/chat/completions", content=(b"x" * 2**20 for _ in range(17)), headers=headers)
    assert chunked.status_code == 413  # no Content-Length: counted as it arrives
    # None of it left a mark: the next answer is right.
    assert client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=5).choices[0].message.content is not None
    assert server.health()["running"] == 0
    assert server.health()["group"] == {"size": 1, "rank": 0}  # a process alone (distributed.md)


def test_growing_conversation_processes_only_what_is_new(client, model, engine):
    """An agent's five requests, each the whole conversation so far: after the first, each
    processes only what was added since the last prompt (the last answer and the new message)
    plus the prompt's own tail that the history renders differently (the empty thought
    channel, left out of the history), and reuses the rest."""
    prompt = engine.encode(ask("x"))
    history = engine.encode(ask("x") + [{"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}])
    tail = len(prompt) - next(i for i, (a, b) in enumerate(zip(prompt, history)) if a != b)
    assert 0 < tail <= 12
    messages = [{"role": "system", "content": "You are terse."}]
    last_prompt = None
    for turn in range(5):
        messages.append({"role": "user", "content": f"Question number {turn}: what time is it?"})
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
        u = reply.usage
        if last_prompt is not None:
            added = u.prompt_tokens - last_prompt
            assert u.x_prompt_processed <= added + tail, (turn, u)
            assert u.prompt_tokens_details.cached_tokens == u.x_prompt_reused >= last_prompt - tail - 1
        last_prompt = u.prompt_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


def test_two_clients_at_once(server, client, model, engine):
    questions = ["Hello there", "Tell me a story"]
    answers = {}

    def run(q):
        answers[q] = client.chat.completions.create(model=model, messages=ask(q), max_tokens=60,
                                                    extra_body={"x_report": True, "mtp": q == questions[0]})

    threads = [threading.Thread(target=run, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for q in questions:
        assert ids(answers[q].choices[0].x_tokens) == engine.generate(ask(q), max_tokens=60).tokens


def test_requests_run_together_and_a_dropped_stream_frees_its_row(server, client, model, engine):
    long = dict(model=model, messages=ask("What time is it?"), max_tokens=3000, extra_body={"mtp": False})
    served, dropped = server.health()["served"], server.health()["dropped"]
    stream = client.chat.completions.create(stream=True, **long)
    chunks = iter(stream)
    first = [next(chunks) for _ in range(3)]
    assert first[0].choices[0].delta.role == "assistant"
    waiting = {}
    # Long enough to be seen beside the long answer on a loaded machine: /health counts the rows
    # of the last step, and an 8-token answer drafted 8 at a time is over in two or three steps.
    queued = threading.Thread(target=lambda: waiting.update(r=client.chat.completions.create(
        model=model, messages=ask("Hi"), max_tokens=60, extra_body={"x_report": True})))
    queued.start()
    busy, deadline = server.health(), time.monotonic() + 60
    while busy["batch"]["rows"] != 2 and queued.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
        busy = server.health()
    assert busy["running"] == 2 and busy["waiting"] == 0 and busy["batch"]["rows"] == 2, busy  # decoding together
    # The model's work does not hold up the event loop: other connections are answered at once.
    started = time.perf_counter()
    for _ in range(5):
        server.health()
    assert (time.perf_counter() - started) / 5 < 0.5
    stream.close()  # the client leaves mid-answer
    assert server.wait_idle(timeout=10) < 10
    queued.join(30)
    server.wait_idle(timeout=10)
    health = server.health()
    assert health["served"] == served + 2 and health["dropped"] == dropped + 1, health  # the stream, not the answer
    # 3,000 tokens would take far longer than this test: the answer stopped when the client left.
    assert ids(waiting["r"].choices[0].x_tokens) == engine.generate(ask("Hi"), max_tokens=60).tokens
    again = client.chat.completions.create(model=model, messages=ask("Hello there"), max_tokens=30,
                                           extra_body={"x_report": True})
    assert ids(again.choices[0].x_tokens) == engine.generate(ask("Hello there"), max_tokens=30).tokens


def test_ctrl_c_stops_a_streaming_answer_and_shuts_down_cleanly(checkpoints):
    s = Server(checkpoints)
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.chat.completions.create(model=client.models.list().data[0].id, messages=ask("What time is it?"),
                                                max_tokens=3000, stream=True, extra_body={"mtp": False})
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        s.proc.send_signal(signal.SIGINT)
        rest = []
        with pytest.raises(openai.APIError, match="The server is shutting down"):  # an error, not [DONE]
            rest.extend(chunks)
        assert s.proc.wait(30) == 0
    finally:
        s.stop()
    assert len(rest) < 1000  # of a 3,000-token answer
    log = s.output()
    assert "Traceback" not in log and "Error" not in log, log


def test_serve_reports_a_missing_model_in_one_line(tmp_path):
    from serving import ENV, ROOT

    out = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "serve", "--model", str(tmp_path / "none"),
                          "--port", "9"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert out.returncode == 1 and out.stderr.strip() == f"mlx-spec: target {tmp_path / 'none'}: no such folder"


def test_a_client_that_times_out_without_streaming_frees_the_model(server, client, model, engine):
    body = {"model": model, "messages": ask("What time is it?"), "max_tokens": 3000, "mtp": False}
    with pytest.raises(httpx.ReadTimeout):  # 3,000 tokens take far longer than this
        httpx.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=2)
    assert server.wait_idle(timeout=5) < 5
    reply = client.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=10, extra_body={"x_report": True})
    assert ids(reply.choices[0].x_tokens) == engine.generate(ask("Hi"), max_tokens=10).tokens


def test_a_client_that_leaves_during_a_long_prompt_stops_it_and_keeps_its_part(server, client, model, engine):
    """A client leaves a second into a prompt of 3,500 tokens (seconds of prefill here): the
    prompt stops at its next chunk, and the part that went through goes back to the prompt
    cache, so the same prompt sent again resumes it and answers as the engine does."""
    import numpy as np

    prompt = np.random.RandomState(5).randint(110, 380, 3500).tolist()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 5},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=1)
    server.wait_idle(timeout=60)
    again = client.completions.create(model=model, prompt=prompt, max_tokens=5, extra_body={"x_report": True})
    assert 0 < again.usage.x_prompt_reused < len(prompt) - 2, again.usage  # stopped part way, the part kept
    assert ids(again.choices[0].x_tokens) == engine.generate(prompt, max_tokens=5).tokens


def test_a_model_that_calls_tools_round_trip(trained, checkpoints):
    """The tiny target trained to call two tools (tests/chat_script.py), through the server:
    the calls come back as OpenAI tool_calls with ids and finish_reason "tool_calls"; the
    results go back as `role: "tool"` messages, and the answer from them equals the engine's,
    with the conversation's prompt reused. A raw completion returns its thought as written."""
    from chat_script import GREETING, HELLO, QUESTION, THOUGHT, TOOLS as CLOCK

    server = Server({"text": trained, "assistant": checkpoints["assistant"]})
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        engine = load(str(trained), str(checkpoints["assistant"]))
        model = client.models.list().data[0].id
        messages = ask(QUESTION)
        first = client.chat.completions.create(model=model, messages=messages, tools=CLOCK, max_tokens=200, temperature=0)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        calls = choice.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_current_time", {"city": "Taipei"}), ("get_current_time", {"city": "New York"})]
        assert len({c.id for c in calls}) == 2
        messages += [choice.message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": c.id, "content": t} for c, t in zip(calls, ["21:04", "08:04"])]
        second = client.chat.completions.create(model=model, messages=messages, tools=CLOCK, max_tokens=200, temperature=0)
        expected = engine.generate(messages, tools=CLOCK, max_tokens=200)
        assert second.choices[0].message.content == expected.text
        assert second.usage.prompt_tokens == len(engine.encode(messages, CLOCK))
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 12
        # A raw completion of the thinking prompt: the text as the model wrote it, the thought's
        # markers and label kept (its end-of-turn token is a stop: left out); stop strings match it.
        thinks = engine.encode(ask(GREETING), thinking=True)
        written = f"<|channel>thought\n{THOUGHT}<channel|>{HELLO}"
        raw = client.completions.create(model=model, prompt=thinks, max_tokens=60, temperature=0)
        assert (raw.choices[0].text, raw.choices[0].finish_reason) == (written, "stop")
        streamed = client.completions.create(model=model, prompt=thinks, max_tokens=60, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == written
        cut = client.completions.create(model=model, prompt=thinks, max_tokens=60, temperature=0, stop="<channel|>")
        assert (cut.choices[0].text, cut.choices[0].finish_reason) == (f"<|channel>thought\n{THOUGHT}", "stop")
    finally:
        server.stop()


def test_messages_to_a_checkpoint_without_a_chat_template(no_template, checkpoints):
    """A base model's tokenizer has no chat template: chat requests are refused with a 400 that
    says so and what to send instead; raw completions still work."""
    s = Server({"text": no_template, "assistant": checkpoints["assistant"]})
    try:
        plain = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
        name = plain.models.list().data[0].id
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError, match="has none .*token ids or plain text") as raised:
                reply = plain.chat.completions.create(model=name, messages=ask("Hi"), max_tokens=3, stream=stream)
                list(reply) if stream else reply
            assert raised.value.status_code == 400 and raised.value.body["code"] == "invalid_value"
        assert plain.completions.create(model=name, prompt="Hi", max_tokens=3).choices[0].text is not None
    finally:
        s.stop()
