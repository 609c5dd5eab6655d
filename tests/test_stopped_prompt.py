"""A prompt stopped while it goes through the target (its request was cancelled): it stops at
the next chunk, the sequence keeps the part that went through, consistent, and the prompt
cache gets it back; resumed, it gives what a fresh sequence gives, past the sliding window,
greedy and seeded. The server's job gives its sequence back however it is closed."""

import numpy as np
import pytest

import tiny
from mlx_spec.decoding.prompt_cache import PromptCache
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.errors import PromptStopped
from mlx_spec.generation import Generation
from mlx_spec.options import Options
from mlx_spec.server.generation import Done, Started, Token, generation

CHUNK = 8  # a prompt of many chunks on the tiny model, each smaller than its window of 12
LENGTH = 7 * tiny.WINDOW


@pytest.fixture(scope="module")
def prompt():
    return np.random.RandomState(3).randint(5, tiny.VOCAB, size=LENGTH).tolist()


def stop_after(asked: int):
    """A stop that says yes the `asked`-th time it is asked."""
    count = {"n": 0}

    def stop():
        count["n"] += 1
        return count["n"] >= asked

    return stop


def answer(engine, state, tokens, n=40, **settings):
    decoder = engine.decoder(**settings)
    decoder.prefill_chunk = CHUNK
    decoder.start(state, tokens)
    return [r.token for r in decoder.generate(state, n)]


@pytest.mark.parametrize("asked", [1, 2, 5])
@pytest.mark.parametrize("settings", [{}, {"temperature": 1.0, "seed": 11}], ids=["greedy", "seeded"])
def test_a_stopped_prompt_keeps_what_went_through_and_resumes_exactly(engine, prompt, asked, settings):
    state = SequenceState(engine.target)
    decoder = engine.decoder(**settings)
    decoder.prefill_chunk = CHUNK
    with pytest.raises(PromptStopped) as stopped:
        decoder.start(state, prompt, stop=stop_after(asked))
    assert stopped.value.processed == asked * CHUNK  # the chunks before the stop, no more
    assert state.tokens == prompt[: asked * CHUNK + 1] and state.cached == len(state.tokens) - 1
    expected = answer(engine, SequenceState(engine.target), prompt, **settings)
    assert answer(engine, state, prompt, **settings) == expected


def test_a_stop_that_never_says_so_changes_nothing(engine, prompt):
    state = SequenceState(engine.target)
    decoder = engine.decoder()
    decoder.prefill_chunk = CHUNK
    decoder.start(state, prompt, stop=lambda: False)
    assert state.tokens == prompt and state.cached == LENGTH - 1
    assert [r.token for r in decoder.generate(state, 40)] == answer(engine, SequenceState(engine.target), prompt)


def test_a_stopped_generation_gives_its_part_back_to_the_prompt_cache(engine, prompt):
    """Stopped in the prompt: the cache gets the part back, and the same prompt sent again
    resumes it (only the rest goes through) and answers as a fresh one."""
    cache = PromptCache(engine.target, 1 << 30)
    stopped = Generation(engine, prompt, Options(max_tokens=20), cache=cache, stop=stop_after(1))
    stopped.decoder.prefill_chunk = CHUNK
    with pytest.raises(PromptStopped):
        stopped.start()
    assert len(cache) == 1 and cache.sequences[0].tokens == prompt[: CHUNK + 1]
    again = Generation(engine, prompt, Options(max_tokens=20), cache=cache)
    tokens = [r.token for r in again]
    assert again.decoder.stats.prompt_reused == CHUNK
    assert tokens == engine.generate(prompt, max_tokens=20).tokens


@pytest.mark.parametrize("events", [1, 4], ids=["at Started", "mid-answer"])
def test_the_server_s_job_gives_its_sequence_back_wherever_it_is_closed(engine, prompt, events):
    """A client that leaves once the prompt is in (the worker closes the job at `Started`, or
    after a few tokens): the sequence goes back consistent, and the conversation sent again
    reuses it."""
    cache = PromptCache(engine.target, 1 << 30)
    options = Options(max_tokens=30)
    job = generation(prompt, options)(engine, cache)
    seen = [next(job) for _ in range(events)]
    assert isinstance(seen[0], Started) and all(isinstance(e, Token) for e in seen[1:])
    job.close()
    assert len(cache) == 1
    held = cache.sequences[0]
    assert held.tokens[: len(prompt)] == prompt and held.cached == len(held.tokens) - 1
    again = list(generation(prompt, options)(engine, cache))
    assert again[0].cached_tokens == len(prompt) - 2  # all but the last two: a repeated prompt redoes its last token
    assert isinstance(again[-1], Done) and again[-1].result.tokens == engine.generate(prompt, max_tokens=30).tokens


def test_the_server_s_job_stopped_in_its_prompt_ends_without_events(engine):
    """A prompt of three of the server's chunks (PREFILL_CHUNK), cancelled from the start: it
    stops after the first chunk, and the cache holds that chunk."""
    from mlx_spec.decoding.limits import PREFILL_CHUNK

    long_prompt = np.random.RandomState(4).randint(5, tiny.VOCAB, size=2 * PREFILL_CHUNK + 100).tolist()
    cache = PromptCache(engine.target, 1 << 30)
    asked = []
    job = generation(long_prompt, Options(max_tokens=5))(engine, cache, lambda: asked.append(1) or True)
    assert list(job) == [] and len(asked) == 1
    assert len(cache) == 1 and cache.sequences[0].tokens == long_prompt[: PREFILL_CHUNK + 1]
