"""Qwen3.5 decoded by mlx-spec's loop, exactly transformers' greedy answer (issue: Qwen).

Its Gated DeltaNet layers' state cannot be trimmed: a rejected guess must leave it as the kept
positions alone would (models/qwen3_5/recurrent.py). Scripted drafters (tests/scripted.py) make
every cycle keep all its guesses, none, or exactly j, at draft lengths up to 6; rows of a batch
each keep their own count in the same step; a row leaves part way and resumes in a later turn
from its mark. Every answer must be transformers' own greedy continuation, token for token."""

from functools import lru_cache

import mlx.core as mx
import pytest
import torch

import tiny_qwen
from scripted import ScriptedDrafter

from mlx_spec.decoding.batch import Batch
from mlx_spec.decoding.decoder import Decoder
from mlx_spec.decoding.draft_lengths import DraftLengths
from mlx_spec.decoding.reports import WAITING
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.drafting.lookup import PromptLookup
from mlx_spec.models.checkpoint import read_checkpoint
from mlx_spec.models.qwen3_5.loader import target_from
from mlx_spec.models.qwen3_5.target import Target
from mlx_spec.sampling.settings import SamplingSettings

ANSWER = 40
PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 7, 8, 300, 12, 64, 64, 2, 11, 19, 5, 17, 99, 3, 250],
           [9, 8, 7, 6, 5, 4, 3, 2],
           [200 + i % 50 for i in range(90)]]


@pytest.fixture(scope="module", params=["dense", "moe"])
def qwen(request, tmp_path_factory):
    """(our target, transformers' greedy answer to a prompt: prompt -> ANSWER tokens)."""
    moe = request.param == "moe"
    folder = tiny_qwen.build(tmp_path_factory.mktemp(request.param), moe=moe)
    model = target_from(read_checkpoint(folder, "target"))
    mx.eval(model.parameters())
    reference, _ = tiny_qwen.reference(folder, moe=moe)

    @lru_cache(maxsize=None)
    def answer(prompt: tuple) -> list:
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=ANSWER, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    return Target(model), answer


def decoder(target, drafter=None, g=None, lengths=None):
    return Decoder(target, SamplingSettings(), drafter, g, stop_tokens=[], lengths=lengths)


def alone(target, prompt, drafter=None, g=None):
    dec = decoder(target, drafter, g)
    state = SequenceState(target)
    dec.start(state, prompt)
    return [r.token for r in dec.generate(state, ANSWER)], dec.stats


def read_together(batch, readers, leave=lambda i, out: False) -> list:
    """Each reader's tokens, read in turn (the batch stepped whenever one waits) until all end;
    `leave(i, tokens so far)` closes reader i there (it leaves the batch part way)."""
    outputs, live = [[] for _ in readers], list(range(len(readers)))
    while live:
        for i in list(live):
            if leave(i, outputs[i]):
                readers[i].close()
                live.remove(i)
                continue
            report = next(readers[i], None)
            if report is None:
                live.remove(i)
            elif report is WAITING:
                batch.step()
            else:
                outputs[i].append(report.token)
    return outputs


@pytest.mark.parametrize("g", [1, 3, 6])
def test_every_number_of_kept_guesses_gives_transformers_answer(qwen, g):
    target, answer = qwen
    prompt = PROMPTS[0]
    expected = answer(tuple(prompt))
    for break_at in (None, *range(g)):  # all kept, then exactly j of g
        drafter = ScriptedDrafter(prompt + expected, target.vocab_size, break_at=break_at)
        tokens, stats = alone(target, prompt, drafter, g)
        assert tokens == expected, (g, break_at)
        kept = g if break_at is None else break_at
        assert stats.drafted > 0 and stats.kept >= kept * (stats.cycles - 2), (g, break_at, stats.kept, stats.cycles)


def test_mtp_off_and_prompt_lookup_give_transformers_answer(qwen):
    target, answer = qwen
    for prompt in PROMPTS:
        expected = answer(tuple(prompt))
        assert alone(target, prompt)[0] == expected
        assert alone(target, prompt, PromptLookup(), None)[0] == expected
        assert alone(target, prompt, PromptLookup(), 4)[0] == expected


def test_rows_of_a_batch_each_keep_their_own_guesses(qwen):
    """Three rows in one batch, each keeping its own count of guesses in the same step (all,
    none, one of four), while one leaves half way: every row's answer is its own alone."""
    target, answer = qwen
    lengths = DraftLengths()
    batch = Batch(target, lengths)
    plans = [(None, 3), (0, 5), (1, 4)]
    states, readers = [], []
    for prompt, (break_at, g) in zip(PROMPTS, plans):
        drafter = ScriptedDrafter(prompt + answer(tuple(prompt)), target.vocab_size, break_at=break_at)
        dec = decoder(target, drafter, g, lengths)
        state = SequenceState(target)
        dec.start(state, prompt)
        states.append(state)
        readers.append(batch.join(dec, state, ANSWER))
    # Row 1 leaves half way: its caches come out of the storage, replayed.
    outputs = read_together(batch, readers, leave=lambda i, out: i == 1 and len(out) >= ANSWER // 2)
    for i, prompt in enumerate(PROMPTS):
        expected = answer(tuple(prompt))
        assert outputs[i] == expected[: len(outputs[i])] and len(outputs[i]) >= ANSWER // 2, i
    assert len(outputs[0]) == len(outputs[2]) == ANSWER
    # The row that left holds what it handed over, and, where its caches could not go back so
    # far (no further than where its last pass began), the next of its answer's tokens, settled;
    # its next turn resumes from what it handed over, and answers as transformers does the whole
    # conversation.
    state, handed = states[1], outputs[1]
    expected = PROMPTS[1] + answer(tuple(PROMPTS[1]))
    assert state.tokens == expected[: len(state.tokens)] and len(state.tokens) >= len(PROMPTS[1] + handed)
    follow = PROMPTS[1] + handed + [42, 43]
    dec = decoder(target, PromptLookup(), None)
    dec.start(state, follow)
    assert dec.stats.prompt_reused > 0
    assert [r.token for r in dec.generate(state, ANSWER)] == answer(tuple(follow))


def test_a_conversation_goes_back_to_its_marks(qwen):
    """The recurrent state cannot be trimmed to any point, only brought back to a mark: a
    prompt that leaves the last one part way resumes from the mark before it and prefills the
    rest, and answers as transformers does."""
    target, answer = qwen
    prompt = PROMPTS[2]
    dec = decoder(target, PromptLookup(), None)
    state = SequenceState(target)
    dec.start(state, prompt)
    first = [r.token for r in dec.generate(state, ANSWER)]
    assert first == answer(tuple(prompt))
    edited = prompt[:60] + [7, 8, 9]  # leaves the first prompt at 60: before its end's mark
    dec = decoder(target, PromptLookup(), None)
    dec.start(state, edited)
    assert [r.token for r in dec.generate(state, ANSWER)] == answer(tuple(edited))


def test_rows_joining_a_running_batch_start_from_their_own_state(qwen):
    """A row that joins after the batch has run passes with guesses brings nothing to replay (its
    stash as long as the others', none of it kept), and a row that joins after one left takes
    its place: every answer is still transformers'."""
    target, answer = qwen
    lengths = DraftLengths()
    batch = Batch(target, lengths)
    outputs, readers = {}, {}

    def join(i, break_at, g):
        prompt = PROMPTS[i]
        drafter = ScriptedDrafter(prompt + answer(tuple(prompt)), target.vocab_size, break_at=break_at)
        dec = decoder(target, drafter, g, lengths)
        state = SequenceState(target)
        dec.start(state, prompt)
        readers[i], outputs[i] = batch.join(dec, state, ANSWER), []

    def run(until):
        while not until():
            for i in list(readers):
                report = next(readers[i], None)
                if report is None:
                    del readers[i]
                elif report is WAITING:
                    batch.step()
                else:
                    outputs[i].append(report.token)

    join(0, 2, 5)
    run(lambda: len(outputs[0]) >= 12)
    join(1, None, 4)  # joins while row 0's last pass had 6 positions
    run(lambda: len(outputs[1]) >= 10)
    readers.pop(0).close()  # row 0 leaves part way
    join(2, 0, 3)
    run(lambda: not readers)
    for i, prompt in enumerate(PROMPTS):
        expected = answer(tuple(prompt))
        assert outputs[i] == expected[: len(outputs[i])], i
    assert len(outputs[1]) == len(outputs[2]) == ANSWER and len(outputs[0]) >= 12
