"""Qwen3.5 / Qwen3.6 as a registered family: loaded by `mlx_spec.load`, prompts rendered by
Qwen's own chat templates (tests/data), thoughts and Qwen3-Coder XML tool calls read back
(typed by the tools' schemas), and answers exactly transformers' greedy ones (issue: Qwen)."""

import hashlib
import json

import mlx.core as mx
import pytest
import torch

import tiny_qwen

import mlx_spec
from mlx_spec.decoding.reports import TokenReport
from mlx_spec.errors import SettingsError
from mlx_spec.generation import build_result
from mlx_spec.models import FAMILIES
from mlx_spec.models.qwen3_5 import FAMILY
from mlx_spec.models.qwen3_5.chat_format import parse_tool_calls
from mlx_spec.models.qwen3_5.drafter import MTPDraft
from mlx_spec.models.qwen3_5.mtp import MTPCache
from mlx_spec.models.qwen3_5.facts import kv_cache_bytes

WEATHER = {"type": "function", "function": {
    "name": "lookup_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "metric": {"type": "boolean"}}}}}
CALL_TEXT = ("<tool_call>\n<function=lookup_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
             "</parameter>\n</function>\n</tool_call>")
# One tool round trip as Qwen3.5's template renders it (its system turn aside): the thought kept
# within the turn the calls continue, arguments as parameters, the result as a user turn.
ROUND_TRIP = ("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nI should query weather.\n</think>"
              f"\n\n{CALL_TEXT}<|im_end|>\n<|im_start|>user\n<tool_response>\n{{\"c\":21}}\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n<think>\n")
HISTORY = [{"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "", "reasoning_content": "I should query weather.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "lookup_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": '{"c":21}'}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tiny_qwen.build(tmp_path_factory.mktemp("qwen-chat"))
    return tiny_qwen.save_tokenizer(folder)


@pytest.fixture(scope="module")
def engine(folder):
    return mlx_spec.load(str(folder))


def test_the_vendored_templates_are_qwens_own():
    sums = {"3.5": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
            "3.6": "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259"}
    for version, path in tiny_qwen.TEMPLATES.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sums[version], path


def test_the_registry_knows_qwen_and_its_drafter_is_its_own_mtp_layer(engine, folder):
    assert FAMILIES.family_for_config(json.loads((folder / "config.json").read_text())) is FAMILY
    assert engine.pair.family is FAMILY
    assert isinstance(engine.pair.assistant, MTPDraft) and engine.pair.drafter_path == folder
    assert engine.pair.target.mtp is engine.pair.assistant.layer  # the target's passes write its K/V
    assert mlx_spec.load(str(folder), drafter=None).pair.target.mtp is None


def test_a_checkpoint_without_an_mtp_layer_drafts_by_lookup(tmp_path):
    folder = tiny_qwen.save_tokenizer(tiny_qwen.build(tmp_path, mtp=False))
    engine = mlx_spec.load(str(folder))
    assert engine.pair.assistant is None
    assert engine.generate([{"role": "user", "content": "hi"}], max_tokens=4).stats.generated_tokens > 0


def test_a_tool_round_trip_renders_as_qwens_template_writes_it(engine):
    """OpenAI-shaped history (arguments as a JSON string) through the engine: Qwen's own text."""
    assert engine.render(HISTORY, thinking=True) == ROUND_TRIP
    assert engine.render(HISTORY[:1], thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_calls_are_typed_by_their_schema_and_render_back_as_written(engine):
    (call,) = parse_tool_calls(f"Let me look.\n\n{CALL_TEXT}", [WEATHER])
    assert (call["name"], call["arguments"]) == ("lookup_weather", {"city": "Paris", "days": 2})
    assert parse_tool_calls(CALL_TEXT)[0]["arguments"] == {"city": "Paris", "days": "2"}  # no schema: as written
    bad = CALL_TEXT.replace("\n2\n", "\n2.5\n")
    assert parse_tool_calls(bad, [WEATHER]) == []  # an integer's parameter holding 2.5: not a call
    message = engine.text.format.assistant_message("", [call], thinking="I should query weather.")
    rendered = engine.render([HISTORY[0], message, HISTORY[2]], thinking=True)
    assert rendered == ROUND_TRIP


def _reports(engine, text: str):
    return [TokenReport(t, drafted=False, cycle=i, prob=0.5) for i, t in enumerate(engine.text.tokenizer.encode(text))]


def test_a_thought_opened_by_the_prompt_and_a_call_are_read_into_their_channels(engine):
    prompt = engine.encode([{"role": "user", "content": "Weather?"}], thinking=True)
    im_end = engine.text.tokenizer.convert_tokens_to_ids("<|im_end|>")
    reports = _reports(engine, f"I should query weather.\n</think>\n\nChecking.\n\n{CALL_TEXT}") + [
        TokenReport(im_end, drafted=False, cycle=99, prob=0.5)]
    steps = list(engine.text.with_text(iter(reports), [WEATHER], prompt))
    shown = {channel: "".join(s.text for s in steps if s.channel == channel) for channel in ("thought", "answer")}
    assert shown == {"thought": "I should query weather.\n", "answer": "Checking.\n\n"}
    result = build_result(engine, steps, stats=None, limit=100, tools=[WEATHER])
    assert result.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in result.tool_calls] == [("lookup_weather", {"city": "Paris", "days": 2})]
    # Thinking off: the prompt closed an empty thought, so the first token is the answer's.
    off = engine.encode([{"role": "user", "content": "Weather?"}], thinking=False)
    steps = list(engine.text.with_text(iter(_reports(engine, "Sunny.")), None, off))
    assert {s.channel for s in steps} == {"answer"}


@pytest.mark.parametrize("messages, wrong", [
    ([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}], "system message only as the first"),
    ([{"role": "system", "content": "sys"}], "needs a user message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
                                          "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
     "not JSON"),
])
def test_what_qwens_template_refuses_is_a_clear_error(engine, messages, wrong):
    with pytest.raises(SettingsError, match=wrong):
        engine.encode(messages)


@pytest.mark.parametrize("drafter", [None, "auto"])
def test_a_chat_answer_is_transformers_greedy_answer(engine, folder, drafter):
    """The prompt as transformers' tokenizer renders it, the answer as its model continues it
    (MTP off, and drafting with its MTP layer and prompt lookup), up to Qwen's stop tokens."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. The quick brown fox"}]
    expected_prompt = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=False, return_dict=False)
    assert engine.encode(messages) == list(expected_prompt)
    model, _ = tiny_qwen.reference(folder)
    stops = sorted(engine.stop_tokens)
    with torch.no_grad():
        out = model.generate(torch.tensor([expected_prompt]), max_new_tokens=30, do_sample=False,
                             eos_token_id=stops, pad_token_id=stops[-1])
    expected = out[0, len(expected_prompt):].tolist()
    chosen = engine if drafter == "auto" else mlx_spec.load(str(folder), drafter=None)
    result = chosen.generate(messages, max_tokens=30, temperature=0.0)
    assert result.tokens == expected


def test_the_memory_check_counts_what_the_caches_hold(engine, folder):
    """kv_cache_bytes: the full-attention layers' and the MTP layer's K/V at the context, plus
    the Gated DeltaNet state, read against what a prefill of that many positions leaves in the
    caches; and what a row of the loop keeps beside them to roll those back, read against the
    storage after the longest pass it takes."""
    from mlx_spec.models.batch_pass import MAX_POSITIONS

    config = json.loads((folder / "config.json").read_text())
    target, context = engine.pair.target, 64
    cache = target.make_cache(0)
    target.prefill(mx.array([[5] * context]), cache, chunk=32)
    attention = [c for c in cache if hasattr(c, "keys")]
    held = sum(c.keys[..., :context, :].nbytes + c.values[..., :context, :].nbytes for c in attention)
    held += sum(a.nbytes for c in cache if not hasattr(c, "keys") for a in c.cache)
    assert isinstance(cache[-1], MTPCache) and len(attention) == 3  # two full-attention layers and the MTP's
    storage = target.batch_caches(0, MAX_POSITIONS)
    storage.add(cache)
    target.forward_batch(mx.array([[6] * MAX_POSITIONS]), storage)
    rollback = sum(part.nbytes for stash in storage.stashes for part in stash) + storage.before.nbytes
    assert kv_cache_bytes(config, context, 0) == held + rollback
