"""Prompt lookup's n-gram index: the same guesses as a search of the whole text, kept in step
with its sequence as it grows and goes back, in pieces or in bulk, through hash collisions; and
one index per sequence, so conversations that alternate never re-index each other."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlx_spec.drafting.ngrams as ngrams
from mlx_spec import PromptCache
from mlx_spec.drafting.ngrams import NgramIndex


def searched(tokens, g):
    """The definition: the latest earlier occurrence of the longest final n-gram (4 to 2
    tokens), and what followed it, continued into itself."""
    length = len(tokens)
    for n in range(ngrams.MAX_NGRAM, ngrams.MIN_NGRAM - 1, -1):
        if length <= n:
            continue
        for e in range(length - 1, n - 1, -1):
            if tokens[e - n : e] == tokens[-n:]:
                out = []
                for j in range(e, e + g):
                    out.append(tokens[j] if j < length else out[j - length])
                return out
    return []


@pytest.mark.parametrize(
    "tokens, g, expected",
    [
        ([1, 2, 3, 4, 5, 6, 7, 1, 2, 3], 4, [4, 5, 6, 7]),  # copy what followed the last match
        ([9, 9, 9, 9], 3, [9, 9, 9]),  # a repeat continues itself
        ([1, 2, 3, 1, 2, 3, 1, 2], 5, [3, 1, 2, 3, 1]),
        ([5, 6, 7, 8], 3, []),  # nothing repeats: no guesses
        ([1, 2], 3, []),
        ([1, 2, 3, 4, 1, 2, 3, 4, 7, 1, 2, 3], 2, [4, 7]),  # the latest occurrence wins
    ],
)
def test_guesses(tokens, g, expected):
    assert NgramIndex().continuation(tokens, g) == expected == searched(tokens, g)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 5), min_size=1, max_size=90)),  # long: the bulk path
        st.tuples(st.just("cut"), st.integers(0, 40)),
        st.tuples(st.just("look"), st.integers(1, 8)),
    ),
    max_size=30,
)


def replay(ops):
    index, tokens = NgramIndex(), []
    for op, arg in ops:
        if op == "add":
            tokens += arg
        elif op == "cut":
            keep = max(len(tokens) - arg, 0)
            index.cut(tokens, keep)
            del tokens[keep:]
        assert index.continuation(tokens, arg if op == "look" else 6) == searched(tokens, arg if op == "look" else 6)
        assert index.upto == len(tokens)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_the_index_follows_its_sequence(ops):
    """Growing by one token or by a prompt's worth, going back by any amount, looked up after
    every change: always the guesses a search of the whole text gives."""
    replay(ops)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_hash_collisions_cost_steps_not_guesses(ops):
    """With a hash that collides most of the time, hits are checked against the tokens."""
    original_one, original_many = ngrams._hash, ngrams._hashes
    ngrams._hash = lambda tokens, end, n: original_one(tokens, end, n) % 3
    ngrams._hashes = lambda tokens, ends, n: original_many(tokens, ends, n) % np.uint64(3)
    try:
        replay(ops)
    finally:
        ngrams._hash, ngrams._hashes = original_one, original_many


def test_two_conversations_alternating_keep_their_own_index(engine, monkeypatch):
    """Two conversations take turns through one prompt cache, each turn sending the whole
    conversation again, as agents do. Each sequence keeps its index: every turn indexes only
    its new tokens, and the answers are the target's own."""
    indexed = []
    original = NgramIndex._index_up_to

    def counting(self, tokens):
        indexed.append(len(tokens) - self.upto)
        original(self, tokens)

    monkeypatch.setattr(NgramIndex, "_index_up_to", counting)
    rng = np.random.RandomState(3)
    block = {name: rng.randint(5, 300, size=20).tolist() for name in "ab"}
    talks = {name: block[name] * 3 for name in "ab"}  # repeats itself: lookup has matches
    cache = PromptCache(engine.target, max_bytes=10**9)
    for turn in range(3):
        for name in "ab":
            before = sum(indexed)
            result = engine.generate(talks[name], max_tokens=24, cache=cache)
            assert result.tokens == engine.generate(talks[name], max_tokens=24, mtp=False).tokens
            assert result.stats.drafted_by_source.get("lookup", 0) > 0
            if turn:  # resumed: only what is new since this conversation's last turn
                assert sum(indexed) - before <= 24 + len(block[name]) + 17  # + a last cycle not yet indexed
            talks[name] = talks[name] + result.tokens + block[name]
