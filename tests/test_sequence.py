"""Going back in a sequence (`SequenceState.rewind` and marks), the one mechanism behind
chat sessions and the prompt cache: wherever it resumes from, what follows is exactly what a
fresh sequence over the same tokens gives, past the sliding window."""

import numpy as np
import pytest

import tiny
from mlx_spec.decoding.prompt_cache import PromptCache
from mlx_spec.decoding.limits import TRIM_ALLOWANCE as MAX_TRIM
from mlx_spec.decoding.sequence import MAX_MARKS, SequenceState

PROMPT = 3 * tiny.WINDOW
ANSWER = 10 * tiny.WINDOW  # longer than the sliding caches can trim back (MAX_TRIM)


@pytest.fixture(scope="module")
def tokens():
    return np.random.RandomState(7).randint(5, tiny.VOCAB, size=400).tolist()


def answer(engine, state, n=ANSWER, **settings):
    decoder = engine.decoder(**settings)
    return [r.token for r in decoder.generate(state, n)]


def start(engine, state, tokens, **settings):
    decoder = engine.decoder(**settings)
    decoder.start(state, tokens)
    return decoder.stats


def fresh(engine, tokens, n=30, **settings):
    state = SequenceState(engine.target)
    start(engine, state, tokens, **settings)
    return answer(engine, state, n, **settings)


def conversation(engine, tokens):
    """A state that took a prompt (marked) and generated an answer past what it can trim."""
    state = SequenceState(engine.target)
    start(engine, state, tokens[:PROMPT])
    answer(engine, state)
    assert ANSWER > MAX_TRIM and state.cache[0].furthest - MAX_TRIM > PROMPT
    return state


@pytest.mark.parametrize("back", [1, 3, 6])
def test_rewind_a_few_tokens_before_the_mark(engine, tokens, back):
    """Gemma 4's empty thought channel ends every prompt and is left out of the history: the
    new rendering leaves the prompt a few tokens before its end."""
    state = conversation(engine, tokens)
    new = tokens[: PROMPT - back] + tokens[200:240]
    assert state.rewind(new) == PROMPT - back
    stats = start(engine, state, new)
    assert stats.prompt_reused == PROMPT - back - 1 and stats.prompt_tokens == len(new) - (PROMPT - back)
    assert answer(engine, state, 30) == fresh(engine, new)


def test_rewind_into_the_answer_goes_back_to_the_mark(engine, tokens):
    state = conversation(engine, tokens)
    held = list(state.tokens)
    new = held[: PROMPT + ANSWER // 2] + tokens[300:320]  # differs in the middle of the answer
    assert state.rewind(new) == PROMPT  # the mark at the end of the prompt
    start(engine, state, new)
    assert answer(engine, state, 30) == fresh(engine, new)


def test_rewind_near_the_end_trims(engine, tokens):
    state = conversation(engine, tokens)
    held = list(state.tokens)
    new = held[:-5] + tokens[300:310]
    assert state.rewind(new) == len(held) - 5
    start(engine, state, new)
    assert answer(engine, state, 30) == fresh(engine, new)


def test_extension_keeps_everything_and_a_repeat_redoes_the_last_token(engine, tokens):
    state = conversation(engine, tokens)
    held = list(state.tokens)
    assert state.rewind(held + [7, 8]) == len(held)
    assert state.rewind(held) == len(held) - 1


def test_no_usable_point_starts_over(engine, tokens):
    state = conversation(engine, tokens)
    state.marks.clear()
    new = tokens[:10] + tokens[300:330]
    assert state.rewind(new) == 0 and state.cached == 0 and state.tokens == []
    start(engine, state, new)
    assert answer(engine, state, 30) == fresh(engine, new)


def test_one_mark_serves_two_continuations(engine, tokens):
    """Restoring a mark and writing after it must not change the mark."""
    state = conversation(engine, tokens)
    for other in (tokens[300:340], tokens[340:380]):
        new = tokens[:PROMPT] + other
        assert state.rewind(new) == PROMPT
        start(engine, state, new)
        got = answer(engine, state, ANSWER)
        assert got[:30] == fresh(engine, new)


def test_sampled_answers_after_a_rewind_equal_fresh_ones(engine, tokens):
    settings = dict(temperature=1.0, top_k=40, top_p=0.9, seed=3)
    state = conversation(engine, tokens)
    new = tokens[: PROMPT - 4] + tokens[200:230]
    start(engine, state, new, **settings)
    assert answer(engine, state, 40, **settings) == fresh(engine, new, 40, **settings)


def test_marks_are_bounded_and_settled(engine, tokens):
    state = SequenceState(engine.target)
    with pytest.raises(ValueError, match="needs a settled state"):
        state.mark()
    for i in range(MAX_MARKS + 3):
        start(engine, state, tokens[: 20 * (i + 1)])
    assert [cp.length for cp in state.marks] == [20 * (i + 1) for i in range(3, MAX_MARKS + 3)]
    sliding = [c for c in state.cache if hasattr(c, "snapshot")]
    assert state.marks[-1].nbytes == sum(c.nbytes for c in sliding)


def test_prompt_cache_resumes_the_closest_conversation_within_its_bounds(engine, tokens):
    cache = PromptCache(engine.target, max_bytes=10**9, max_sequences=2)
    a, b = tokens[:40], tokens[100:140]
    for prompt in (a, b):
        state, held = cache.take(prompt)
        assert held == 0
        start(engine, state, prompt)
        answer(engine, state, 20)
        cache.give_back(state)
    resumed = a + [9, 10, 11]
    state, held = cache.take(resumed)
    assert held == 40 and len(cache) == 1  # conversation a, out of the cache while in use
    start(engine, state, resumed)
    assert answer(engine, state, 30) == fresh(engine, resumed)
    cache.give_back(state)
    cache.give_back(SequenceState(engine.target))  # an empty sequence is not kept
    assert len(cache) == 2
    newest = cache.sequences[-1]
    cache.max_bytes = newest.nbytes  # room for the newest only: the oldest goes
    cache.give_back(SequenceState(engine.target))
    assert cache.sequences == [newest]


def test_a_mark_taken_after_a_trim_back_is_not_trimmed_below_its_reach(engine, tokens):
    """A prompt that resumed by trimming far back (the sliding caches had gone further) is
    marked with that furthest mark: going back before it must not trust the mark to
    reach `MAX_TRIM` below its own offset (it once raised 'cannot trim')."""
    state = conversation(engine, tokens)
    held = list(state.tokens)
    furthest = state.cache[0].furthest
    new = held[: furthest - MAX_TRIM + 2] + tokens[300:302]  # resumes by trimming, no mark
    start(engine, state, new)  # the mark at len(new) remembers `furthest`
    answer(engine, state, 5)
    other = new[: len(new) - MAX_TRIM + 1] + tokens[350:360]  # within MAX_TRIM of that mark
    length = state.rewind(other)
    start(engine, state, other)
    assert answer(engine, state, 30) == fresh(engine, other)
    assert length <= len(other) - 10


def test_a_conversation_sharing_only_a_system_prompt_leaves_the_others_intact(engine, tokens):
    """Two agents' conversations that share a system prompt, interleaved: each resumes its own
    sequence, instead of the other taking it and rewinding it to the system prompt."""
    cache = PromptCache(engine.target, max_bytes=10**9, max_sequences=4)
    system = tokens[:10]
    held_back = {}
    for name, prompt in (("a", system + tokens[10:40]), ("b", system + tokens[100:130])):
        state, held = cache.take(prompt)
        assert held == 0
        start(engine, state, prompt)
        answer(engine, state, 20)
        held_back[name] = list(state.tokens)
        cache.give_back(state)
    assert len(cache) == 2
    for name, extra in (("a", tokens[200:210]), ("b", tokens[210:220])):
        prompt = held_back[name] + extra
        state, held = cache.take(prompt)
        assert held == len(held_back[name])  # its whole conversation so far
        start(engine, state, prompt)
        assert answer(engine, state, 30) == fresh(engine, prompt)
        cache.give_back(state)


def test_a_prompt_the_target_fails_on_leaves_an_empty_state(engine, tokens, monkeypatch):
    """Half-written caches are never kept: the state is emptied, and the next prompt is exact."""
    state = conversation(engine, tokens)
    real = engine.target.prefill

    def failing(tokens, cache, *args, **kwargs):
        real(tokens[:, : tokens.shape[1] // 2], cache, *args, **kwargs)  # half written, then the failure
        raise RuntimeError("the device failed")

    monkeypatch.setattr(engine.target, "prefill", failing)
    with pytest.raises(RuntimeError, match="the device failed"):
        start(engine, state, list(state.tokens) + tokens[300:340])
    assert state.tokens == [] and state.cached == 0
    monkeypatch.undo()
    new = tokens[:PROMPT] + tokens[300:340]
    start(engine, state, new)
    assert answer(engine, state, 30) == fresh(engine, new)


def test_a_prompt_too_long_changes_nothing(engine, tokens):
    from mlx_spec.errors import SettingsError

    state = conversation(engine, tokens)
    held, cached = list(state.tokens), state.cached
    from mlx_spec import Generation, Options

    with pytest.raises(SettingsError, match="prompt too long"):  # the request path checks it first
        Generation(engine, tokens[:10] * 500, Options(max_tokens=1), state=state).start()
    assert state.tokens == held and state.cached == cached


# -- any combination of operations -------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("prompt"), st.integers(1, 30)),  # new prompt tokens after what is held
        st.tuples(st.just("answer"), st.integers(1, 40)),  # an answer of this many tokens
        st.tuples(st.just("leave"), st.integers(1, 20)),  # an answer the caller leaves after n tokens
        st.tuples(st.just("rewind"), st.integers(1, 60)),  # a prompt that goes back n tokens, then on
    ),
    min_size=1, max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPERATIONS, seed=st.integers(0, 2**16))
def test_any_sequence_of_operations_continues_as_a_fresh_one(engine, ops, seed):
    """Prompts, answers (with drafting), callers leaving early and rewinds into the answer or
    the prompt, in any order, past the sliding window: the state always holds exactly its
    settled tokens, and what it generates next equals a fresh sequence over those tokens."""
    rng = np.random.default_rng(seed)
    state = SequenceState(engine.target)

    def prompt(tokens):
        start(engine, state, tokens, draft_tokens=3)
        assert state.tokens == tokens and state.cached == len(tokens) - 1

    prompt(rng.integers(5, tiny.VOCAB, 8).tolist())
    for op, n in ops:
        if op == "prompt":
            prompt(state.tokens + rng.integers(5, tiny.VOCAB, n).tolist())
        elif op == "answer":
            held = list(state.tokens)
            got = answer(engine, state, n, draft_tokens=3)
            assert state.tokens == held + got
        elif op == "leave":
            held, stream = list(state.tokens), engine.decoder(draft_tokens=4).generate(state, 60)
            got = [next(stream).token for _ in range(n)]
            stream.close()
            assert state.tokens == held + got
        else:
            keep = max(len(state.tokens) - n, 1)
            prompt(state.tokens[:keep] + rng.integers(5, tiny.VOCAB, 3).tolist())
        assert state.cached == len(state.tokens) - 1 and len(state.marks) <= MAX_MARKS
    held = list(state.tokens)
    assert answer(engine, state, 6) == fresh(engine, held, 6)
