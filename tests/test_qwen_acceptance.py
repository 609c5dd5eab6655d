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
    """(the share of guesses kept, cycles that kept none / some / all of their g), every answer
    checked against MTP off's."""
    kept = drafted = 0
    counts = [0, 0, 0]
    for prompt, expected in zip(prompts, off):
        answer = engine.generate(prompt, Options(max_tokens=ANSWER, draft_tokens=g, lookup=False))
        assert answer.tokens == expected
        stats = answer.stats
        kept, drafted = kept + stats.kept, drafted + stats.drafted
        full = stats.cycles_by_g.get(g, 0)
        firsts, alls = stats.kept_by_position[0], stats.kept_by_position[g - 1]
        counts = [counts[0] + full - firsts, counts[1] + firsts - alls, counts[2] + alls]
    return kept / drafted, counts


def test_the_first_guess_is_kept_as_the_layer_was_trained_to_guess(pair):
    """The layer agrees with the target's greedy next token about 19 times in 20 after its
    training; our drafter, fed the target's hidden states from our passes, keeps as many."""
    share, _ = kept_share(*pair, g=1)
    assert share >= 0.9


def test_deeper_guesses_are_kept_all_none_or_some_and_the_answers_stay_the_target_s(pair):
    share, (none, some, every) = kept_share(*pair, g=3)
    assert none > 0 and some > 0 and every > 0
    assert 0.2 < share < 0.9


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
        assert together.drafted == alone.drafted and abs(together.kept - alone.kept) <= 1, row
