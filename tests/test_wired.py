"""The model's memory is wired while it decodes, as mlx-lm's generate wires it: on Metal the
wired limit goes to the recommended working set and comes back after, on every path that
decodes (a generation, a chat turn, the bench's runs), however the decoding ends; without Metal
the limit is never touched."""

import mlx.core as mx
import pytest

RECOMMENDED = 12_000_000_000
PROMPT = list(range(1, 30))


@pytest.fixture
def wiring(monkeypatch):
    """A Metal-like device: its recommended working set, and every set_wired_limit call."""
    calls = []
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": RECOMMENDED})

    def set_wired_limit(limit):
        calls.append(limit)
        return 7  # the limit before: what must be restored

    monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
    return calls


def test_no_metal_no_wiring(engine, monkeypatch):
    assert not mx.metal.is_available()
    calls = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda limit: calls.append(limit) or 0)
    assert len(engine.generate(PROMPT, max_tokens=10).tokens) == 10
    assert calls == []


def test_a_generation_wires_and_restores(engine, wiring):
    engine.generate(PROMPT, max_tokens=10)
    assert wiring == [RECOMMENDED, 7]


def test_a_stream_left_early_restores_the_limit(engine, wiring):
    stream = iter(engine.stream(PROMPT, max_tokens=50))
    next(stream)
    assert wiring == [RECOMMENDED]  # wired while it decodes
    stream.close()
    assert wiring == [RECOMMENDED, 7]


def test_a_chat_turn_and_the_bench_s_runs_wire(engine, wiring):
    from mlx_spec.bench.runs import SAMPLING, run_ours

    session = engine.chat(max_tokens=5)
    list(session.send("Hello"))
    assert wiring == [RECOMMENDED, 7]
    run_ours(engine, PROMPT, SAMPLING["greedy"], 5)
    assert wiring == [RECOMMENDED, 7] * 2


def test_a_model_near_the_working_set_is_warned_about(engine, monkeypatch, wiring, capsys):
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 1000})
    engine.generate(PROMPT, max_tokens=3)
    assert "close to the maximum recommended size" in capsys.readouterr().out
