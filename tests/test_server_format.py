"""The server's pieces without a process: OpenAI objects from the engine's results (tool calls
from the tokens Gemma 4 writes for one), stop strings across token boundaries, request checks."""

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mlx_spec import load
from mlx_spec.models.protocol import ANSWER, THOUGHT
from mlx_spec.decoding.stats import Stats
from mlx_spec.decoding.reports import TokenReport
from mlx_spec.generation import StopStrings, build_result
from mlx_spec.server.generation import Done, Token
from mlx_spec.server.chat_objects import chat_logprobs, ChatFormat
from mlx_spec.server.schemas import ChatRequest, CompletionRequest

CALL = '<|tool_call>call:get_time{city:<|"|>Taipei<|"|>}<tool_call|>'


@pytest.fixture(scope="module")
def engine(checkpoints):
    return load(str(checkpoints["text"]), drafter=None)


def generated(engine, text, end):
    """Reports for the tokens of `text` and a stop token, as the engine streams them."""
    ids = engine.tokenizer.encode(text, add_special_tokens=False) + [end]
    steps = list(engine.text.with_text(TokenReport(t, drafted=False, cycle=i, prob=0.5) for i, t in enumerate(ids)))
    tokens = [Token(s, engine.text.token_text(s.token), s.token in engine.stop_tokens, engine.text.token_bytes)
              for s in steps]
    return steps, tokens


def test_logprobs_bytes_rebuild_characters_split_over_byte_tokens(engine):
    """An emoji and two CJK characters, each over several byte tokens: each token's text alone
    is a replacement character, and its `bytes` are now its bytes (they were the replacement
    character's, found by a review), so that joined they rebuild the text, as OpenAI's do."""
    text = "Hi 😀 台北"
    steps, tokens = generated(engine, text, engine.tokenizer.convert_tokens_to_ids("<turn|>"))
    entries = chat_logprobs(tokens, 0)["content"]
    assert "\ufffd" in "".join(e["token"] for e in entries)
    assert bytes(b for e in entries for b in e["bytes"]).decode() == text


def test_a_generated_tool_call_comes_back_as_openai_tool_calls(engine):
    steps, tokens = generated(engine, "Let me check." + CALL, engine.tokenizer.convert_tokens_to_ids("<|tool_response>"))
    result = build_result(engine, steps, Stats(generated_tokens=len(steps)))
    assert result.finish_reason == "tool_calls"
    form = ChatFormat("tiny", logprobs=True, top_logprobs=0, report=False)
    reply = ChatCompletion.model_validate(form.completion(40, tokens, Done(result, result.finish_reason, result.text)))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"city": "Taipei"}
    # logprobs list the answer's tokens only: not the call's, not the stop token.
    assert "".join(e.token for e in choice.logprobs.content) == "Let me check."
    # Streamed: the call's tokens show nothing; one delta carries the whole call, with its index.
    chunks = [c for c in map(form.token_chunk, tokens) if c is not None]
    chunks += form.last_chunks(40, Done(result, result.finish_reason, result.text), include_usage=True)
    chunks = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Let me check."
    (delta,) = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert delta[0].index == 0 and delta[0].id == call.id and delta[0].function.arguments == call.function.arguments
    assert chunks[-2].choices[0].finish_reason == "tool_calls" and chunks[-1].usage.prompt_tokens == 40


@pytest.mark.parametrize("written, end", [
    ('<|tool_call>call:get_time{city:<|"|>Taipei<|"|>,,}<tool_call|>', "<|tool_response>"),
    ('<|tool_call>call:get_time{city:<|"|>Tai', None),
], ids=["malformed", "cut-off-by-the-budget"])
def test_a_call_that_does_not_read_as_one_shows_as_the_text_written(engine, written, end):
    """A block that holds no call the format reads (malformed, or cut off where the budget
    ended) shows in the answer as the model wrote it, streamed and whole alike. Before, its
    tokens stayed in the tool-call channel and the answer ended with neither text nor a call."""
    ids = engine.tokenizer.encode("Let me check." + written, add_special_tokens=False)
    ids += [engine.tokenizer.convert_tokens_to_ids(end)] if end else []
    steps = list(engine.text.with_text(TokenReport(t, drafted=False, cycle=i, prob=0.5) for i, t in enumerate(ids)))
    assert [s.token for s in steps] == ids  # every token handed on, in order
    result = build_result(engine, steps, Stats(generated_tokens=len(steps)))
    assert result.tool_calls == [] and result.finish_reason == ("stop" if end else "length")
    assert result.text == "Let me check." + written
    tokens = [Token(s, engine.text.token_text(s.token), s.token in engine.stop_tokens, engine.text.token_bytes)
              for s in steps]
    form = ChatFormat("tiny", logprobs=False, top_logprobs=0, report=False)
    message = form.completion(10, tokens, Done(result, result.finish_reason, result.text))["choices"][0]["message"]
    assert message["content"] == result.text and "tool_calls" not in message
    streamed = [c["choices"][0]["delta"].get("content", "") for c in map(form.token_chunk, tokens) if c is not None]
    assert "".join(streamed) == result.text


def test_each_call_block_settles_on_its_own(engine):
    """Two calls back to back, as Gemma writes parallel calls: a malformed one beside a good one
    shows as text, and the good one is a call."""
    bad = '<|tool_call>call:get_time{city:<|"|>Taipei<|"|>,,}<tool_call|>'
    ids = engine.tokenizer.encode(bad + CALL, add_special_tokens=False)
    ids += [engine.tokenizer.convert_tokens_to_ids("<|tool_response>")]
    steps = list(engine.text.with_text(TokenReport(t, drafted=False, cycle=i, prob=0.5) for i, t in enumerate(ids)))
    result = build_result(engine, steps, Stats(generated_tokens=len(steps)))
    assert result.text == bad and [c["name"] for c in result.tool_calls] == ["get_time"]
    assert result.finish_reason == "tool_calls"


def test_thinking_goes_to_reasoning_content(engine):
    steps, tokens = generated(engine, "<|channel>thought\nHmm.<channel|>Hi!", engine.tokenizer.convert_tokens_to_ids("<turn|>"))
    result = build_result(engine, steps, Stats())
    assert (result.thinking, result.text, result.finish_reason) == ("Hmm.", "Hi!", "stop")
    form = ChatFormat("tiny", logprobs=False, top_logprobs=0, report=False)
    message = form.completion(10, tokens, Done(result, "stop", result.text))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hi!", "reasoning_content": "Hmm."}
    deltas = [c["choices"][0]["delta"] for c in map(form.token_chunk, tokens) if c is not None]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hmm."
    assert "".join(d.get("content", "") for d in deltas) == "Hi!"


def pieces(*items):
    return [TokenReport(i, False, 0, text=text, channel=channel) for i, (text, channel) in enumerate(items)]


def run(stops, reports):
    holder, out, held = StopStrings(stops), [], []
    for r in reports:
        released = holder.feed(r)
        held.append(len(holder.pending))
        out += released
        if holder.hit:
            break
    else:
        out += holder.flush()
    return "".join(r.text for r in out if r.channel == ANSWER), [r.token for r in out], holder.hit, held


def test_stop_strings_across_tokens():
    reports = pieces(("Hel", ANSWER), ("lo", ANSWER), (" wo", ANSWER), ("rld", ANSWER))
    assert run(["o w"], reports)[:3] == ("Hell", [0, 1], True)  # cut inside a token; its text is trimmed
    assert run(["xyz"], reports)[:3] == ("Hello world", [0, 1, 2, 3], False)
    assert run([], reports)[3] == [0, 0, 0, 0]  # nothing held without stop strings
    # While the text ends like the start of a stop string, its tokens are held back.
    assert run(["world!"], reports)[3] == [0, 0, 1, 2]
    # A thought does not count, and is not lost before the stop.
    text, ids, hit, _ = run(["lo"], pieces(("lo", THOUGHT), ("Hel", ANSWER), ("x", THOUGHT), ("lo", ANSWER)))
    assert (text, ids, hit) == ("Hel", [0, 1, 2], True)


def test_what_is_held_back_is_the_longest_end_a_stop_string_begins_with():
    """`held_back` tries only the places a stop string's first character sits; it must hold
    exactly what trying every length holds, on random texts over a small alphabet (where ends
    that begin a stop string, several at once, are common)."""
    import random

    from mlx_spec.generation import held_back

    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab c") for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 12)))
        longest = max(map(len, stops))
        every_length = max((k for k in range(1, min(longest, len(text) + 1))
                            if any(s.startswith(text[-k:]) for s in stops)), default=0)
        assert held_back(text, stops, longest) == every_length, (text, stops)


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "video_url"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "0.5"}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5}, None),
    # found by a review: "false" turned usage on, and best_of 3 answered once without a word
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": "false"}},
     "stream_options"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": "yes"}, "stream_options"),
    ({"prompt": "x", "best_of": 3}, None),
    # found by a review: a text part's null or object was written into the prompt as "None"
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}, {"type": "image_url"}]}]}, "messages"),
    ({"prompt": "x", "best_of": 0}, "best_of"),
])
def test_requests_are_checked(body, param):
    from pydantic import ValidationError

    from mlx_spec.server.app import invalid

    kind = CompletionRequest if "prompt" in body else ChatRequest
    with pytest.raises(ValidationError) as raised:
        kind.model_validate(body)
    error = invalid(raised.value.errors())
    assert error.status == 400 and error.param == param and error.message


def test_openai_messages_become_gemma_native():
    req = ChatRequest.model_validate({"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
    ], "chat_template_kwargs": {"enable_thinking": True}})
    system, call, result = req.messages
    assert system == {"role": "system", "content": "Be brief."}
    assert call["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert result["content"] == {"ok": True}
    assert req.enable_thinking is True


@pytest.mark.parametrize("ended_by", ["budget", "stop token"])
def test_text_cut_inside_a_character_or_before_a_space_is_written_out_at_the_end(engine, ended_by):
    """An answer the budget (or a stop token) ends inside a character, or after a space the
    detokenizer holds to see what follows, ends with what `tokenizer.decode` writes for the same
    tokens: the cut character as U+FFFD, the space kept. (Both were dropped, in the stream and
    the result alike.) Each token's report still comes out in order, one per token."""
    ids = engine.tokenizer.encode("Hi 😀 台北 ok", add_special_tokens=False)
    end = engine.tokenizer.convert_tokens_to_ids("<turn|>")
    cuts = 0
    for n in range(1, len(ids) + 1):
        written = ids[:n]
        stream = written + ([end] if ended_by == "stop token" else [])
        steps = list(engine.text.with_text(TokenReport(t, drafted=False, cycle=i) for i, t in enumerate(stream)))
        assert [s.token for s in steps] == stream
        expected = engine.tokenizer.decode(written)
        assert "".join(s.raw for s in steps) == expected
        result = build_result(engine, steps, Stats(generated_tokens=len(steps)))
        assert result.text == expected
        cuts += expected.endswith("\ufffd") or expected.endswith(" ")
    assert cuts >= 4  # the emoji and each CJK character are several byte tokens; two spaces
