"""Chat sessions keep the caches across turns, exactly; Gemma 4 tool calls for agents."""

import pytest

import tiny
from mlx_spec import load
from mlx_spec.chat import parse_tool_calls, tool_result
from mlx_spec.engine import Engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_time",
            "description": "The current time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = '<|tool_call>call:get_current_time{city:<|"|>Taipei<|"|>}<tool_call|>'


@pytest.fixture(scope="module")
def engine(checkpoints):
    return load(str(checkpoints["text"]), str(checkpoints["assistant"]))


def test_second_turn_processes_only_the_new_message_and_stays_exact(engine):
    session = engine.chat(max_tokens=25)
    first = [r.token for r in session.send("Hello there")]
    first_prompt = session.last_stats.prompt_tokens
    history = list(session.state.tokens)
    second = [r.token for r in session.send("Tell me more")]
    assert session.restarts == 0
    new_turn = len(session.state.tokens) - len(second) - len(history)
    assert session.last_stats.prompt_tokens == new_turn  # the pending token + the new turn, minus its last
    assert new_turn < first_prompt + len(first)
    # Exact: the same as generating from the whole token history in one go, with no cache reuse.
    prompt = session.state.tokens[: len(session.state.tokens) - len(second)]
    fresh = engine.generate(prompt, max_tokens=25)
    assert fresh.tokens == second


def test_session_with_and_without_mtp_agree(engine):
    on = engine.chat(max_tokens=20)
    off = engine.chat(max_tokens=20, mtp=False)
    for text in ["Hello there", "What time is it?"]:
        assert [r.token for r in on.send(text)] == [r.token for r in off.send(text)]
    assert on.last_stats.drafted > 0 and off.last_stats.drafted == 0


def test_reset_and_settings_change(engine):
    session = engine.chat(max_tokens=10)
    a = [r.token for r in session.send("Hi")]
    session.reset()
    session.set(mtp=False)
    assert session.state.cached == 0 and session.messages == []
    assert [r.token for r in session.send("Hi")] == a
    assert session.last_stats.drafted == 0


def test_stopping_mid_answer_keeps_the_session_consistent(engine):
    session = engine.chat(max_tokens=40)
    count = 0

    def stop_after_7():
        return count >= 7

    for _ in session.send("Hello there", should_stop=stop_after_7):
        count += 1
    assert count == 7
    assert session.state.cached == len(session.state.tokens) - 1
    assert len(session.state.tokens) == len(engine.encode(session.messages[:-1])) + 7
    assert session.messages[-1]["role"] == "assistant"
    second = [r.token for r in session.send("Go on")]
    assert session.restarts == 0  # the history the session holds is what the caller saw
    prompt = session.state.tokens[: len(session.state.tokens) - len(second)]
    assert engine.generate(prompt, max_tokens=40).tokens == second


def test_tools_render_into_the_prompt(engine):
    rendered = engine.tokenizer.decode(engine.encode([{"role": "user", "content": "Hi"}], tools=TOOLS))
    assert "<|tool>declaration:get_current_time" in rendered
    assert '"city"' in rendered


def test_tool_call_output_parses():
    assert parse_tool_calls(f"Let me check. {CALL}") == [{"name": "get_current_time", "arguments": {"city": "Taipei"}}]
    two = CALL + CALL.replace("Taipei", "New York")
    assert [c["arguments"]["city"] for c in parse_tool_calls(two)] == ["Taipei", "New York"]
    assert parse_tool_calls("<|tool_call>not a call<tool_call|>") == []


def test_generation_result_carries_tool_calls(engine):
    tokens = list(engine.tokenizer.encode(CALL, add_special_tokens=False)) + [tiny.END_OF_TURN_ID]
    from mlx_spec.decoder import Stats
    from mlx_spec.reports import TokenReport

    steps = [TokenReport(token=t, drafted=False, cycle=0) for t in tokens]
    result = engine.result(steps, Stats())
    assert result.finish_reason == "stop"
    assert result.tool_calls == [{"name": "get_current_time", "arguments": {"city": "Taipei"}}]


def test_tool_result_continues_the_conversation(engine):
    session = engine.chat(tools=TOOLS, max_tokens=8)
    list(session.send("What time is it in Taipei?"))
    # Pretend the model called the tool (the tiny random model cannot): replace its answer.
    session.messages[-1] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_current_time", "arguments": {"city": "Taipei"}}}],
    }
    answer = [r.token for r in session.send(tool_result("get_current_time", {"time": "21:04"}))]
    assert len(answer) > 0
    rendered = engine.tokenizer.decode(session.state.tokens)
    assert '<|tool_response>response:get_current_time{value:<|"|>{"time": "21:04"}<|"|>}' in rendered
    assert "<|tool_call>call:get_current_time" in rendered
    # The history was rewritten (the model's own answer replaced), so the session started over.
    assert session.restarts == 1


def test_chat_needs_a_tokenizer(checkpoints):
    from mlx_spec.sampling import SettingsError

    engine = load(str(checkpoints["google"]), drafter=None)
    with pytest.raises(SettingsError, match="a chat session needs a tokenizer"):
        engine.chat()


def test_engine_without_stop_tokens_is_possible(engine):
    plain = Engine(engine.target, engine.assistant, engine.tokenizer, stop_tokens=[])
    assert plain.generate("Hi", max_tokens=5).finish_reason == "length"
