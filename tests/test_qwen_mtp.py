"""Qwen3.5's MTP layer drafting in mlx-spec's loop: its guesses are the reference head's
(tests/tiny_qwen.py: transformers' own decoder layer and norms, run over the whole history each
time), after a prefill in chunks, and after a batch kept all, none or some of the guesses; and
the answers stay transformers' greedy ones, and the seeded sampled ones MTP off gives.

The reference drafts from scratch: the target's hidden states after its final norm at every
settled position, paired with the next token's embedding (the pair (h_t, x_{t+1}) at position
t), then its own outputs for the deeper guesses. Our drafter reads K/V the target's passes wrote
in its cache, rewritten where guesses were rejected: any slot written wrong changes a guess."""

import mlx.core as mx
import pytest
import torch

import tiny_qwen
from scripted import ScriptedDrafter
from test_qwen_rows import ANSWER, PROMPTS, alone, read_together

from mlx_spec.decoding.batch import Batch
from mlx_spec.decoding.decoder import Decoder
from mlx_spec.decoding.draft_lengths import DraftLengths
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.drafting import DraftContext
from mlx_spec.drafting.mtp import MTPDrafter
from mlx_spec.models.checkpoint import read_checkpoint
from mlx_spec.models.qwen3_5.drafter import MTPDraft
from mlx_spec.models.qwen3_5.loader import join, mtp_from, target_from
from mlx_spec.models.qwen3_5.target import Target
from mlx_spec.sampling.settings import SamplingSettings


class Qwen:
    """Our target joined to its MTP layer, and transformers' model and reference head."""

    def __init__(self, folder, moe):
        checkpoint = read_checkpoint(folder, "target")
        model = target_from(checkpoint)
        mx.eval(model.parameters())
        self.target, self.draft = Target(model), MTPDraft(mtp_from(checkpoint, model.language_model.args))
        join(self.target, self.draft)
        self.model, self.head = tiny_qwen.reference(folder, moe=moe)
        self._answers = {}

    def answer(self, prompt) -> list:
        """transformers' greedy answer (ANSWER tokens)."""
        key = tuple(prompt)
        if key not in self._answers:
            with torch.no_grad():
                out = self.model.generate(torch.tensor([key]), max_new_tokens=ANSWER, do_sample=False,
                                          eos_token_id=None, pad_token_id=0)
            self._answers[key] = out[0, len(key):].tolist()
        return self._answers[key]

    def drafts(self, tokens, g: int) -> list:
        """The reference head's g greedy guesses after settled `tokens` (the last not yet in any cache)."""
        with torch.no_grad():
            hidden = self.model.model(torch.tensor([tokens[:-1]])).last_hidden_state
            following = torch.tensor([tokens[1:]])
            guesses = []
            for _ in range(g):
                embedded = self.model.model.embed_tokens(following)
                out = self.head(embedded, hidden, torch.arange(hidden.shape[1]))[:, -1:]
                guess = self.model.lm_head(out).argmax(-1)
                guesses.append(int(guess))
                hidden, following = torch.cat([hidden, out], 1), torch.cat([following, guess], 1)
        return guesses

    def first_state(self, tokens) -> torch.Tensor:
        """The reference head's output (after mtp.norm) for the first guess after `tokens`, [H]."""
        with torch.no_grad():
            hidden = self.model.model(torch.tensor([tokens[:-1]])).last_hidden_state
            embedded = self.model.model.embed_tokens(torch.tensor([tokens[1:]]))
            return self.head(embedded, hidden, torch.arange(hidden.shape[1]))[0, -1]

    def our_first_state(self, tokens, cache, hidden) -> torch.Tensor:
        """Our draft step's output for the first guess, over a sequence's own caches."""
        kv = self.draft.kv_inputs(self.target.drafter_buffers(cache))
        token = self.target.embed(mx.array([[tokens[-1]]]))
        h, _ = self.draft.step(token, self.draft.carry(hidden, kv, 1), kv, mx.array(len(tokens) - 1))
        return torch.tensor(h[0, 0].tolist())

    def our_drafts(self, tokens, cache, hidden, g: int) -> list:
        """Our drafter's g guesses over a sequence's own caches."""
        context = DraftContext(tokens=list(tokens), last_token=mx.array([[tokens[-1]]], mx.int32), hidden=hidden,
                               kv=self.target.drafter_buffers(cache), settings=SamplingSettings(),
                               uniforms=mx.zeros((g, 2)))
        return MTPDrafter(self.draft, self.target).draft(context, g).tokens.tolist()


@pytest.fixture(scope="module", params=["dense", "moe", "tied"])
def qwen(request, tmp_path_factory):
    """Dense and MoE with their own heads, and dense with the head tied to the embedding."""
    moe, tied = request.param == "moe", request.param == "tied"
    folder = tiny_qwen.build(tmp_path_factory.mktemp(f"mtp-{request.param}"), moe=moe, tie_word_embeddings=tied)
    return Qwen(folder, moe)


@pytest.mark.parametrize("chunk", [5, 64])
def test_after_a_prefill_in_chunks_the_drafts_are_the_reference_heads(qwen, chunk):
    for prompt in PROMPTS:
        cache = qwen.target.make_cache(0)
        hidden = qwen.target.prefill(mx.array([prompt[:-1]]), cache, chunk)
        assert qwen.our_drafts(prompt, cache, hidden, 5) == qwen.drafts(prompt, 5), (len(prompt), chunk)
        torch.testing.assert_close(qwen.our_first_state(prompt, cache, hidden), qwen.first_state(prompt), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("g, break_at", [(3, None), (3, 0), (3, 2), (6, 4), (1, None)])
def test_after_a_batch_kept_all_none_or_some_the_drafts_are_the_reference_heads(qwen, g, break_at):
    """A batch pass writes the pairs of its positions; the rejected ones are rewritten by the
    next. After the answer, the row's caches come back to its sequence (the MTP layer's K/V and
    the hidden state before its offset): their drafts are the reference's over what it holds."""
    prompt = PROMPTS[0]
    expected = qwen.answer(prompt)
    drafter = ScriptedDrafter(prompt + expected, qwen.target.vocab_size, break_at=break_at)
    decoder = Decoder(qwen.target, SamplingSettings(), drafter, g, stop_tokens=[])
    state = SequenceState(qwen.target)
    decoder.start(state, prompt)
    assert [r.token for r in decoder.generate(state, ANSWER)] == expected
    assert qwen.our_drafts(state.tokens, state.cache, state.hidden, 4) == qwen.drafts(state.tokens, 4)
    torch.testing.assert_close(qwen.our_first_state(state.tokens, state.cache, state.hidden),
                               qwen.first_state(state.tokens), atol=1e-4, rtol=1e-4)


class Recording(MTPDrafter):
    """The MTP drafter, keeping each batch round's positions and guesses."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rounds = []

    def draft_batch_steps(self, last, hidden, positions, kv, g):
        guesses, steps = yield from super().draft_batch_steps(last, hidden, positions, kv, g)
        self.rounds.append((positions, guesses))
        return guesses, steps


def test_in_a_batch_each_rows_drafts_are_the_reference_heads_for_its_own_text(qwen):
    """Two rows drafting together with the MTP layer (a round for both at once, reading each its
    own K/V in the storage): every guess of every round is the reference head's for that row's
    settled text, and the answers are transformers'."""
    drafter = Recording(qwen.draft, qwen.target)
    lengths = DraftLengths()
    batch = Batch(qwen.target, lengths)
    prompts = [PROMPTS[0], PROMPTS[2]]  # 21 and 90 tokens: a row is known by its positions
    readers = []
    for prompt in prompts:
        decoder = Decoder(qwen.target, SamplingSettings(), drafter, 3, stop_tokens=[], lengths=lengths)
        state = SequenceState(qwen.target)
        decoder.start(state, prompt)
        readers.append(batch.join(decoder, state, ANSWER))
    outputs = read_together(batch, readers)
    texts = [p + qwen.answer(p) for p in prompts]
    assert outputs == [qwen.answer(p) for p in prompts]
    checked = 0
    for positions, guesses in drafter.rounds:
        for position, row in zip(positions.tolist(), guesses.tolist()):
            text = texts[0] if position < len(prompts[1]) - 1 else texts[1]
            assert row == qwen.drafts(text[: position + 1], len(row)), position
            checked += 1
    assert checked >= 10


def test_seeded_sampling_gives_what_mtp_off_gives(qwen):
    """Its guesses are kept while they match the target's own draws: with one seed, MTP on and
    off sample the same tokens."""
    settings = SamplingSettings(temperature=0.9, top_p=0.95, seed=7)
    answers = []
    for drafter, g in ((None, None), (MTPDrafter(qwen.draft, qwen.target), 3)):
        decoder = Decoder(qwen.target, settings, drafter, g, stop_tokens=[])
        state = SequenceState(qwen.target)
        decoder.start(state, PROMPTS[0])
        answers.append([r.token for r in decoder.generate(state, ANSWER)])
    assert answers[0] == answers[1]


def test_greedy_answers_with_the_mtp_drafter_are_transformers(qwen):
    for prompt in PROMPTS:
        for g in (1, 4):
            assert alone(qwen.target, prompt, MTPDrafter(qwen.draft, qwen.target), g)[0] == qwen.answer(prompt)


def test_a_conversation_back_at_its_mark_drafts_as_the_reference(qwen):
    """The next turn leaves the last answer part way: the sequence goes back to a mark (the MTP
    layer's kept hidden states restored with the Gated DeltaNet states), prefills the rest, and
    its drafts are the reference head's over the new text."""
    prompt = PROMPTS[2]
    drafter = MTPDrafter(qwen.draft, qwen.target)
    state = SequenceState(qwen.target)
    decoder = Decoder(qwen.target, SamplingSettings(), drafter, 3, stop_tokens=[])
    decoder.start(state, prompt)
    assert [r.token for r in decoder.generate(state, ANSWER)] == qwen.answer(prompt)
    edited = prompt + qwen.answer(prompt)[:10] + [7, 8, 9]  # leaves the answer part way
    decoder = Decoder(qwen.target, SamplingSettings(), drafter, 3, stop_tokens=[])
    decoder.start(state, edited)
    assert len(prompt) - 1 <= decoder.stats.prompt_reused < len(prompt) + 10  # from the mark at the prompt's end
    assert qwen.our_drafts(state.tokens, state.cache, state.hidden, 4) == qwen.drafts(state.tokens, 4)
    torch.testing.assert_close(qwen.our_first_state(state.tokens, state.cache, state.hidden),
                               qwen.first_state(state.tokens), atol=1e-4, rtol=1e-4)
    assert [r.token for r in decoder.generate(state, ANSWER)] == qwen.answer(edited)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return Qwen(tiny_qwen.build(tmp_path_factory.mktemp("mtp-sampled")), moe=False)


def test_guesses_drawn_from_the_mtp_layer_keep_the_target_s_distribution(dense):
    """1,000 seeded answers of two tokens with the MTP layer drawing its guesses from its own
    distribution (its sampled step, the min(1, p/q) rule): the first and second tokens follow
    the target's exact distributions at temperature 0.8, top-k 20 and top-p 0.95 (chi-square, as
    tests/test_sampling.py's for Gemma 4; the cut keeps the random tiny model's flat
    distributions to bins a thousand draws can test). The random layer's guesses mostly fall
    outside the target's cut, so this finds a guess kept or drawn where the rule would not have
    it (the answers would follow the layer's distribution), not a q slightly off: the rules'
    own statistics are tests/test_sampling.py's."""
    import numpy as np
    from test_sampling import ALPHA, chi_square_p

    from mlx_spec.sampling.distribution import distribution

    target, prompt, vocab = dense.target, PROMPTS[1], dense.target.vocab_size

    def exact(tokens, settings):
        logits, _ = target.forward(mx.array([tokens]), target.make_cache(0))
        return np.array(distribution(logits[0, -1], settings).dense(vocab))

    settings = dict(temperature=0.8, top_k=20, top_p=0.95)
    p0 = exact(prompt, SamplingSettings(**settings))
    p1 = sum(p0[first] * exact(prompt + [int(first)], SamplingSettings(**settings)) for first in np.nonzero(p0)[0])
    drafter = MTPDrafter(dense.draft, target, sample=True)
    answers, drafted = [], 0
    for seed in range(1000):
        decoder = Decoder(target, SamplingSettings(**settings, seed=seed), drafter, 2, stop_tokens=[])
        state = SequenceState(target)
        decoder.start(state, prompt)
        answers.append([r.token for r in decoder.generate(state, 2)])
        drafted += decoder.stats.drafted
    answers = np.array(answers)
    assert drafted >= 1000  # every answer's first cycle verified the layer's sampled guesses
    assert chi_square_p(np.bincount(answers[:, 0], minlength=vocab), p0) > ALPHA
    assert chi_square_p(np.bincount(answers[:, 1], minlength=vocab), p1) > ALPHA
