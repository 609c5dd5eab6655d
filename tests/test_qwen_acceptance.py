"""Guesses kept as a real pair's are: tests/distilled_qwen.py's target, trained on a made-up
language, and its MTP layer distilled from it. A random layer keeps next to nothing, so only here
does a drafter that reads the wrong hidden state, position or norm show in what is kept (its
tokens stay the target's either way)."""

import pytest
import torch

import distilled_qwen
from mlx_spec import load
from mlx_spec.options import Options

ANSWER = 48


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = distilled_qwen.build(tmp_path_factory.mktemp("distilled") / "pair")
    engine = load(str(folder)).with_stop_tokens([])
    language, generator = distilled_qwen.Language(0), torch.Generator().manual_seed(123)
    prompts = [language.text(32, generator) for _ in range(4)]
    off = [engine.generate(p, Options(max_tokens=ANSWER, mtp=False)).tokens for p in prompts]
    return engine, prompts, off


def kept_share(engine, prompts, off, g) -> tuple:
    """(the share of guesses kept, cycles that drafted and kept none / some / all of their
    guesses), every answer checked against MTP off's. Near an answer's end a cycle drafts fewer
    than g: it counts among those that drafted, and never as keeping all g."""
    kept = drafted = 0
    counts = [0, 0, 0]
    for prompt, expected in zip(prompts, off):
        answer = engine.generate(prompt, Options(max_tokens=ANSWER, draft_tokens=g, lookup=False))
        assert answer.tokens == expected
        stats = answer.stats
        kept, drafted = kept + stats.kept, drafted + stats.drafted
        drafting = sum(n for length, n in stats.cycles_by_g.items() if length > 0)
        firsts = stats.kept_by_position[0] if stats.kept_by_position else 0
        alls = stats.kept_by_position[g - 1] if len(stats.kept_by_position) >= g else 0
        counts = [counts[0] + drafting - firsts, counts[1] + firsts - alls, counts[2] + alls]
    return kept / drafted, counts


def test_the_first_guess_is_kept_as_the_layer_was_trained_to_guess(pair):
    """The layer agrees with the target's greedy next token about 19 times in 20 after its
    training; our drafter, fed the target's hidden states from our passes, keeps as many."""
    share, _ = kept_share(*pair, g=1)
    assert share >= 0.9


def test_deeper_guesses_are_kept_all_none_or_some_and_the_answers_stay_the_target_s(pair):
    """At g = 2 (here about 12, 61 and 20 cycles of each): the second guess, read from the
    layer's own output, is kept less often than the first."""
    share, (none, some, every) = kept_share(*pair, g=2)
    assert none > 0 and some > 0 and every > 0
    assert 0.3 < share < 0.9


def test_a_drafter_that_loses_the_hidden_state_keeps_almost_nothing(pair, monkeypatch):
    """What the test above would see of such a mistake (the tokens stay right)."""
    import mlx.core as mx

    from mlx_spec.models.qwen3_5.drafter import MTPDraft

    carry = MTPDraft.carry
    monkeypatch.setattr(MTPDraft, "carry", lambda self, hidden, kv, steps: (
        mx.zeros_like(hidden), *carry(self, hidden, kv, steps)[1:]))
    share, _ = kept_share(*pair, g=1)
    assert share < 0.3


def test_in_a_batch_each_row_keeps_what_it_keeps_alone(pair):
    """Rows of g = 1, 3 and adaptive decode together: each row's answer is MTP off's, and the
    g = 1 rows keep their guesses as they do alone (the same guesses, from the same hidden
    states, to a rounding that may turn a near tie)."""
    engine, prompts, off = pair
    lengths = (1, 3, None, 1)
    options = [Options(max_tokens=ANSWER, draft_tokens=g, lookup=False) for g in lengths]
    answers = engine.generate_many(prompts, options)
    assert [a.tokens for a in answers] == off
    for row in (0, 3):
        alone = engine.generate(prompts[row], options[row]).stats
        together = answers[row].stats
        # (a turned tie keeps one guess more or fewer, and so settles a cycle sooner or later)
        assert abs(together.drafted - alone.drafted) <= 1 and abs(together.kept - alone.kept) <= 1, row


@pytest.mark.parametrize("g", [1, None])
def test_turns_resumed_from_the_prompt_cache_keep_their_guesses(pair, g):
    """A conversation over three turns through a PromptCache (the server's): each turn resumes the
    last one's sequence, its Gated DeltaNet states from the mark at the answer's end and its MTP
    layer's K/V and kept hidden state with them, and a fourth turn leaves an answer part way
    (back to the mark at that turn's prompt). Every answer is the cold one with MTP off, and
    resumed turns keep as many first guesses as a cold start: a stale hidden state or MTP K/V
    after a resume (where vLLM's MTP bugs lived) changes no token, only this."""
    from mlx_spec import PromptCache

    engine, prompts, _ = pair
    cache = PromptCache(engine.target, 1 << 30)
    options = Options(max_tokens=24, draft_tokens=g, lookup=False)
    language, generator = distilled_qwen.Language(0), torch.Generator().manual_seed(9)
    conversation, kept = list(prompts[0]), []
    for turn in range(4):
        if turn == 3:  # the next message leaves the last answer part way
            conversation = conversation[: -30] + language.text(8, generator)
        answer = engine.generate(conversation, options, cache=cache)
        cold = engine.generate(conversation, Options(max_tokens=24, mtp=False))
        assert answer.tokens == cold.tokens, turn
        if turn:
            assert answer.stats.prompt_reused > len(conversation) // 2, turn
            stats = answer.stats  # first guesses kept, of the cycles that drafted
            kept.append((stats.kept_by_position[0] if stats.kept_by_position else 0,
                         sum(n for length, n in stats.cycles_by_g.items() if length > 0)))
        conversation = conversation + answer.tokens + language.text(8, generator)
    assert sum(k for k, _ in kept) >= 0.85 * sum(d for _, d in kept)
