"""The speculative loop is exact: MTP on == MTP off == transformers, past the sliding window,
with every guess kept, none kept, and every number in between."""

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from mlx_spec import load
from mlx_spec.models.cache import SlidingWindowCache
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.errors import LoadError, SettingsError
from scripted import ScriptedDrafter, StepwiseDrafter
from kv import exact_kv, fresh_cache, prefill, sliced

LONG = 320  # tokens generated: many sliding windows (12) long


@pytest.fixture(scope="module")
def prompt():
    return np.random.RandomState(0).randint(0, tiny.VOCAB, size=2 * tiny.WINDOW + 5).tolist()


@pytest.fixture(scope="module")
def reference(checkpoints, prompt):
    """transformers' greedy continuation: the ground truth."""
    from transformers import Gemma4ForCausalLM

    model = Gemma4ForCausalLM.from_pretrained(checkpoints["text"]).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=LONG, do_sample=False)
    assert out.shape[1] == len(prompt) + LONG
    return out[0].tolist()


def test_mtp_off_equals_transformers(engine, prompt, reference):
    result = engine.generate(prompt, max_tokens=LONG, mtp=False)
    assert result.tokens == reference[len(prompt) :]
    assert result.stats.drafted == 0 and result.stats.cycles == LONG


def test_mtp_assistant_equals_transformers(engine, prompt, reference):
    result = engine.generate(prompt, max_tokens=LONG)
    assert result.tokens == reference[len(prompt) :]
    assert result.stats.drafted > 0


def tokens_per_cycle(steps):
    counts = {}
    for step in steps:
        counts[step.cycle] = counts.get(step.cycle, 0) + 1
    return [counts[c] for c in sorted(counts)]


@pytest.mark.parametrize("g", range(1, 9))
def test_all_guesses_kept(engine, prompt, reference, g):
    drafter = ScriptedDrafter(reference, tiny.VOCAB)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=g)
    assert result.tokens == reference[len(prompt) :]
    per_cycle = tokens_per_cycle(result.steps)
    assert per_cycle[:-1] == [g + 1] * (len(per_cycle) - 1)  # the last one is cut by max_tokens
    # Every guess was kept: g per cycle, and the last cycle's tokens are all guesses unless it
    # ended on its bonus token.
    expected = g * (len(per_cycle) - 1) + min(per_cycle[-1], g)
    assert result.stats.kept == sum(s.drafted for s in result.steps) == expected


@pytest.mark.parametrize("g, break_at", [(g, j) for g in range(1, 9) for j in range(g)])
def test_guesses_break_at_every_position(engine, prompt, reference, g, break_at):
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_at=break_at)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=g, report=False)
    assert result.tokens == reference[len(prompt) :]
    per_cycle = tokens_per_cycle(result.steps)
    assert per_cycle[:-1] == [break_at + 1] * (len(per_cycle) - 1)
    assert result.stats.kept_by_position[break_at:] == [0] * (g - break_at)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_breaks_trim_every_amount_at_every_offset(engine, prompt, reference, seed):
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=0.2, seed=seed)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=7, report=False)
    assert result.tokens == reference[len(prompt) :]
    assert 0 < result.stats.kept < result.stats.drafted


class RecordingDrafter:
    """Wraps a drafter and keeps a copy of what it was given each cycle. A plain object with
    draft(context, g) declares nothing, so it is never asked to draft a cycle ahead, for an
    outcome not yet known (the safe default)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def draft(self, context, g):
        kv = {k: (np.array(v[0]), np.array(v[1])) for k, v in sliced(context.kv).items()}
        self.seen.append((list(context.tokens), np.array(context.hidden), kv))
        return self.inner.draft(context, g)


def test_drafter_sees_only_settled_tokens(engine, prompt, reference):
    """Each cycle the drafter gets the hidden state and K/V a fresh target pass over the settled
    tokens gives: no trace of rejected guesses, also after the sliding window wrapped."""
    scripted = ScriptedDrafter(reference, tiny.VOCAB, break_probability=0.5, seed=3)
    recording = RecordingDrafter(scripted)
    engine.generate(prompt, max_tokens=120, drafter=recording, draft_tokens=4, report=False)
    assert len(recording.seen) > 30
    for tokens, hidden, kv in recording.seen[::5]:
        cache = fresh_cache(engine.target)
        fresh_hidden = engine.target.hidden(mx.array([tokens[:-1]]), cache)[:, -1:]
        assert np.abs(hidden - np.array(fresh_hidden)).max() <= 1e-4
        for kind, (keys, values) in exact_kv(engine.target, cache).items():
            # The newest positions a drafter reads (a batch's row may offer a few older ones
            # of its ring too): exactly a fresh pass's.
            n = keys.shape[-2]
            assert kv[kind][0].shape[-2] >= n
            assert np.abs(kv[kind][0][..., -n:, :] - np.array(keys)).max() <= 1e-4
            assert np.abs(kv[kind][1][..., -n:, :] - np.array(values)).max() <= 1e-4


def test_stop_token_inside_a_kept_run(engine, prompt, reference):
    output = reference[len(prompt) :]
    # A token first seen mid-cycle: with g = 6 all kept, cycles emit output[7c : 7c + 7], and
    # positions 7c + 6 are the target's bonus tokens, not guesses.
    first = next(i for i in range(20, LONG) if output.index(output[i]) == i and i % 7 != 6)
    stop = output[first]
    stopping = engine.with_stop_tokens([stop])
    drafter = ScriptedDrafter(reference, tiny.VOCAB)
    decoder = stopping.decoder(drafter=drafter, draft_tokens=6)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    steps = list(decoder.generate(state, LONG))
    assert [s.token for s in steps] == output[: first + 1]
    assert steps[-1].drafted  # the stop token was a kept guess, not the end of a cycle
    # The caches hold everything but the stop token, which waits to be processed next.
    assert state.cached == len(state.tokens) - 1


@pytest.mark.parametrize("max_tokens", [1, 2, 47, 100])
def test_max_tokens_inside_a_kept_run(engine, prompt, reference, max_tokens):
    drafter = ScriptedDrafter(reference, tiny.VOCAB)
    decoder = engine.decoder(drafter=drafter, draft_tokens=6)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    tokens = [s.token for s in decoder.generate(state, max_tokens)]
    assert tokens == reference[len(prompt) : len(prompt) + max_tokens]
    assert state.cached == len(state.tokens) - 1
    # The state continues exactly where it stopped.
    more = [s.token for s in decoder.generate(state, 30)]
    assert more == reference[len(prompt) + max_tokens : len(prompt) + max_tokens + 30]


@pytest.mark.parametrize("mtp", [True, False])
def test_one_host_sync_per_cycle(engine, prompt, monkeypatch, mtp):
    evals = []
    real_eval = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(1), real_eval(*a))[1])
    result = engine.generate(prompt, max_tokens=60, draft_tokens=6, mtp=mtp)
    prefill_syncs = 1
    assert result.stats.host_syncs == result.stats.cycles
    assert len(evals) == result.stats.cycles + prefill_syncs


def test_same_seed_same_tokens_with_and_without_mtp(engine, prompt):
    settings = dict(temperature=1.0, top_k=64, top_p=0.95, seed=7)
    off = engine.generate(prompt, max_tokens=LONG, mtp=False, **settings)
    on = engine.generate(prompt, max_tokens=LONG, **settings)
    assert on.tokens == off.tokens
    scripted = ScriptedDrafter(prompt + off.tokens, tiny.VOCAB, break_probability=0.3)
    broken = engine.generate(prompt, max_tokens=LONG, drafter=scripted, draft_tokens=5, **settings)
    assert broken.tokens == off.tokens
    assert broken.stats.kept > 0


def test_reports(engine, prompt):
    result = engine.generate(prompt, max_tokens=20, temperature=0.7, top_k=10, top_p=0.9, seed=1)
    for step in result.steps:
        assert 0 < step.prob <= 1 and step.rank >= 1
        assert 0 < step.sampling_prob <= 1 and 1 <= step.candidates <= 10
        assert len(step.top) == 5
        assert [p for _, p, _ in step.top] == sorted((p for _, p, _ in step.top), reverse=True)
        if step.rank <= 5:
            assert step.top[step.rank - 1][0] == step.token
        assert step.text is not None
    greedy = engine.generate(prompt, max_tokens=5)
    assert all(s.rank == 1 and s.sampling_prob == 1.0 and s.candidates == 1 for s in greedy.steps)
    off = engine.generate(prompt, max_tokens=5, report=False)
    assert all(s.prob is None and s.top == [] for s in off.steps)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0"),
        # (its logits overflowed float32: a NaN distribution, and the lowest id drawn; a review)
        (dict(temperature=1e-39), r"temperature must be 0 \(greedy\) or at least 1e-30, got 1e-39"),
        (dict(top_k=385), "top_k must be at most the vocabulary's 384 tokens"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(top_k="5"), "top_k must be an integer >= 0 .*got '5'"),  # (the value as given: not a 5)
        (dict(draft_tokens=-1), "draft_tokens must be between 0 and 16"),
        (dict(draft_tokens=17), "draft_tokens must be between 0 and 16"),
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(max_tokens=2.5), "max_tokens must be an integer >= 1"),
        (dict(stop=["ok", ""]), "stop strings must be non-empty strings"),
        (dict(tempreature=0.5), "unknown setting 'tempreature'"),
        # types: each was a TypeError from a comparison, or taken silently ("no" as true)
        (dict(temperature="0.7"), "temperature must be a finite number >= 0, got '0.7'"),
        (dict(temperature=None), "temperature must be a finite number >= 0, got None"),
        (dict(top_p="0.9"), r"top_p must be in \(0, 1\], got '0.9'"),
        (dict(thinking="no"), "thinking must be True or False"),
        (dict(lookup=1), "lookup must be True or False"),
        (dict(image_tokens=280.0), "image_tokens must be one of"),
    ],
)
def test_impossible_settings(engine, prompt, settings, message):
    with pytest.raises(SettingsError, match=message):
        engine.generate(prompt, **settings)


def test_wrong_kinds_of_arguments_are_named(engine, prompt):
    """Each of these was a raw TypeError or AttributeError, or (a string of prompts) ran each
    character as a prompt; a Generation read twice decoded on a sequence it had given back."""
    from mlx_spec import Options
    from mlx_spec.generation import Generation

    with pytest.raises(SettingsError, match="a prompt must be a string.*got NoneType"):
        engine.generate(None)
    with pytest.raises(SettingsError, match="options must be an Options, got dict"):
        engine.generate(prompt, {"max_tokens": 3})
    with pytest.raises(SettingsError, match="prompts must be a list of prompts"):
        engine.generate_many("ab", max_tokens=2)
    with pytest.raises(SettingsError, match="cache must be a mlx_spec.PromptCache, got int"):  # (an AttributeError)
        engine.generate(prompt, cache=5, max_tokens=2)
    with pytest.raises(SettingsError, match="stop must be a string or a list of strings, got dict"):  # (its keys were taken)
        engine.generate(prompt, stop={"a": 1}, max_tokens=2)
    with pytest.raises(LoadError, match="model must be a size, a hub id or a folder"):
        load(None)
    answer = Generation(engine, prompt, Options(max_tokens=3))
    assert len(list(answer)) == 3
    with pytest.raises(SettingsError, match="read to its end already"):
        list(answer)
    assert len(answer.result.tokens) == 3


def test_a_bad_token_id_does_not_cost_a_cached_conversation(engine):
    """The ids are checked before the prompt cache gives up the sequence that shares the most
    with the prompt: a request with an id outside the vocabulary used to throw it away, and the
    conversation's next turn went through the target again from its first token."""
    from mlx_spec.decoding.prompt_cache import PromptCache

    cache, prompt = PromptCache(engine.target, 10**9), list(range(10, 60))
    first = engine.generate(prompt, max_tokens=5, cache=cache)
    with pytest.raises(SettingsError, match="outside the vocabulary"):
        engine.generate(prompt + first.tokens + [tiny.VOCAB + 3], max_tokens=5, cache=cache)
    again = engine.generate(prompt + first.tokens + [7], max_tokens=5, cache=cache)
    assert len(cache) == 1 and again.stats.prompt_reused >= len(prompt)
    assert again.tokens == engine.generate(prompt + first.tokens + [7], max_tokens=5).tokens


def test_prompt_errors(engine, checkpoints):
    with pytest.raises(SettingsError, match="outside the vocabulary"):
        engine.generate([1, 2, tiny.VOCAB + 5])
    with pytest.raises(SettingsError, match="the prompt is empty"):
        engine.generate([])
    with pytest.raises(SettingsError, match="4000 prompt tokens plus 200 to generate exceed the model's 4096 positions: "
                                            "at most 96 can be generated"):
        engine.generate([5] * 4000, max_tokens=200)
    with pytest.raises(SettingsError, match="prompt too long: 4096 tokens plus 1 to generate"):
        engine.generate([5] * 4096, max_tokens=1)
    no_tokenizer = load(str(checkpoints["google"]), drafter=None)
    with pytest.raises(SettingsError, match="needs a tokenizer"):
        no_tokenizer.generate("hello")
    assert len(no_tokenizer.generate([5, 6, 7], max_tokens=3, mtp=False).tokens) == 3


def test_messages_to_a_checkpoint_without_a_chat_template(no_template):
    engine = load(str(no_template), drafter=None)
    with pytest.raises(SettingsError, match=f"the tokenizer of {no_template} has none.*token ids or plain text"):
        engine.generate([{"role": "user", "content": "Hello"}], max_tokens=3)
    assert len(engine.generate("Hello", max_tokens=3).tokens) >= 1  # plain text still works


def test_text_and_chat_prompts(engine):
    text = engine.generate("Hello there", max_tokens=5)
    chat = engine.generate([{"role": "user", "content": "Hello there"}], max_tokens=5)
    assert len(text.tokens) == len(chat.tokens) == 5
    assert isinstance(text.text, str)
    rendered = engine.tokenizer.decode(engine.encode([{"role": "user", "content": "Hi"}]))
    assert rendered.endswith("<|turn>model\n<|channel>thought\n<channel|>") and "<|turn>user\nHi<turn|>" in rendered


def test_mtp_without_a_drafter(checkpoints):
    no_drafter = load(str(checkpoints["text"]), drafter=None)
    assert no_drafter.generate([5, 6, 7], max_tokens=4, lookup=False).stats.drafted == 0
    with pytest.raises(SettingsError, match="MTP needs a drafter, and none was loaded"):
        no_drafter.generate([5, 6, 7], mtp=True)


@pytest.mark.parametrize("taken", [0, 1, 3, 6, 7, 9])
def test_leaving_early_takes_back_what_was_not_handed_over(engine, prompt, reference, taken):
    """A caller that stops reading after `taken` tokens (mid-cycle, at a cycle's end, with a
    cycle queued) leaves the state holding exactly those tokens; generation resumes from there."""
    drafter = ScriptedDrafter(reference, tiny.VOCAB)
    decoder = engine.decoder(drafter=drafter, draft_tokens=6)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    stream = decoder.generate(state, LONG)
    got = [next(stream).token for _ in range(taken)]
    stream.close()
    assert state.tokens == reference[: len(prompt) + taken]
    assert state.cached == len(state.tokens) - 1
    more = [r.token for r in decoder.generate(state, 40)]
    assert got + more == reference[len(prompt) : len(prompt) + taken + 40]


def test_an_answer_its_caller_left_early_says_cancelled_not_length(engine, prompt):
    """Found by a review: a stream broken off after 7 of 40 tokens reported "length", as if
    max_tokens had been reached. Alone, together, and with the budget really spent."""
    stream = engine.stream(prompt, max_tokens=40)
    reading = iter(stream)
    taken = [next(reading) for _ in range(7)]
    reading.close()
    assert len(stream.result.tokens) == len(taken) == 7 and stream.result.finish_reason == "cancelled"
    many = engine.stream_many([prompt, prompt[:30]], max_tokens=40)
    reading = iter(many)
    taken = [next(reading) for _ in range(9)]
    reading.close()
    assert [r.finish_reason for r in many.results] == ["cancelled", "cancelled"]
    whole = engine.generate(prompt, max_tokens=40)
    assert whole.finish_reason == "length" and whole.stats.prompt_length == len(prompt)
    assert [r.finish_reason for r in engine.generate_many([prompt, prompt[:30]], max_tokens=12)] == ["length"] * 2


def test_a_failing_drafter_leaves_the_state_usable(engine, prompt, reference):
    class BadQ:
        def draft(self, context, g):
            from mlx_spec.drafting import Draft

            return Draft(mx.zeros((g,), mx.int32), q=mx.zeros((g + 1, tiny.VOCAB)))

    decoder = engine.decoder(drafter=BadQ(), draft_tokens=3, temperature=1.0, seed=0)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    list(engine.decoder(mtp=False).generate(state, 5))  # a settled hidden state for the drafter
    with pytest.raises(SettingsError, match=r"drafter returned q of shape \(4, 384\), expected \(3, 384\)"):
        list(decoder.generate(state, 10))
    assert state.cached == len(state.tokens) - 1
    assert [r.token for r in engine.decoder(mtp=False).generate(state, 20)] == reference[len(prompt) + 5 : len(prompt) + 25]


def test_a_drafter_that_returns_no_draft_is_named(engine, prompt, reference):
    """docs/python.md's custom drafter returns a Draft; one returning a list of ids was an
    AttributeError from deep in the loop. It is a SettingsError naming the drafter, and the state
    goes on as before."""
    class Ids:
        def draft(self, context, g):
            return [1] * g

    decoder = engine.decoder(drafter=Ids(), draft_tokens=3)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    with pytest.raises(SettingsError, match=r"Ids object .*: draft\(context, g\) must return a mlx_spec.drafting.Draft .*got list"):
        list(decoder.generate(state, 10))
    held = len(state.tokens)
    assert state.cached == held - 1 and state.tokens == reference[:held]
    assert [r.token for r in engine.decoder(mtp=False).generate(state, 5)] == reference[held:held + 5]

    from mlx_spec.drafting import Draft

    class ListInDraft:  # (an AttributeError from the loop, found by a review)
        def draft(self, context, g):
            return Draft([1] * g)

    with pytest.raises(SettingsError, match=r"ListInDraft object .*: a Draft's tokens must be an mx.array, got list"):
        engine.generate(prompt, drafter=ListInDraft(), draft_tokens=3, max_tokens=6)


class Failed(Exception):
    pass


@pytest.mark.parametrize("where", ["a piece of the next cycle", "the launch of the running one"])
def test_a_failure_while_building_ahead_leaves_the_state_usable(engine, prompt, reference, monkeypatch, where):
    """A failure in the middle of a cycle built ahead (a drafter's step raising), or in the
    launch around it (mx.async_eval raising, as an interrupt would): the caches are put back
    and the state holds exactly the tokens handed over."""
    log, launch = [], mx.async_eval
    drafter = StepwiseDrafter(reference, tiny.VOCAB, log=log)
    if where == "a piece of the next cycle":
        real = drafter.draft_steps

        def draft_steps(context, g):
            if drafter.calls >= 6:
                raise Failed(where)
            return (yield from real(context, g))

        monkeypatch.setattr(drafter, "draft_steps", draft_steps)
    else:
        def failing(*arrays):
            if log.count("piece") >= 30:
                raise Failed(where)
            return launch(*arrays)

        monkeypatch.setattr(mx, "async_eval", failing)
    decoder = engine.decoder(drafter=drafter, draft_tokens=4)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    handed = []
    with pytest.raises(Failed):
        for report in decoder.generate(state, 60):
            handed.append(report.token)
    assert handed and handed == reference[len(prompt) : len(prompt) + len(handed)]
    assert state.cached == len(state.tokens) - 1 and state.tokens == reference[: len(state.tokens)]
    monkeypatch.setattr(mx, "async_eval", launch)
    more = [r.token for r in engine.decoder(mtp=False).generate(state, 20)]
    assert more == reference[len(state.tokens) - 20 : len(state.tokens)]


@pytest.mark.parametrize("failing_launch", [1, 2, 3, 4, 5, 7, 9, 12])
def test_a_failed_launch_leaves_the_state_usable(engine, prompt, reference, monkeypatch, failing_launch):
    """mx.async_eval raising at any launch (a draft step's stage of the running cycle, the
    whole of it, or the first stage of the cycle queued behind it): the state holds exactly the
    tokens handed over, and goes on exactly."""
    launch, launches = mx.async_eval, []

    def failing(*arrays):
        launches.append(1)
        if len(launches) == failing_launch:
            raise Failed("launch")
        return launch(*arrays)

    decoder = engine.decoder(drafter=StepwiseDrafter(reference, tiny.VOCAB, break_probability=0.3, seed=1), draft_tokens=3)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    monkeypatch.setattr(mx, "async_eval", failing)
    handed = []
    with pytest.raises(Failed):
        for report in decoder.generate(state, 60):
            handed.append(report.token)
    monkeypatch.setattr(mx, "async_eval", launch)
    assert state.tokens == prompt + handed and state.cached == len(state.tokens) - 1
    more = [r.token for r in decoder.generate(state, 20)]
    assert more == reference[len(state.tokens) - 20 : len(state.tokens)]


def assert_caches_match_a_fresh_pass(target, state):
    """Every position a query or the drafter can still read holds what a fresh pass over the
    settled tokens writes there: no rejected guess, no cycle dropped unsynced, left behind."""
    fresh = fresh_cache(target)
    prefill(target, mx.array([state.tokens[:-1]]), fresh)
    for ours, theirs in zip(state.cache, fresh):
        assert ours.offset == theirs.offset == len(state.tokens) - 1
        held = min(ours.offset, target.window + 1) if isinstance(ours, SlidingWindowCache) else ours.offset
        for a, b in ((ours, theirs),):
            lo_a, lo_b = a.offset - a.start - held, b.offset - b.start - held
            for name in ("keys", "values"):
                x = np.array(getattr(a, name)[..., lo_a : lo_a + held, :])
                y = np.array(getattr(b, name)[..., lo_b : lo_b + held, :])
                assert np.abs(x - y).max() <= 1e-4, name


def test_cycles_queued_before_their_predecessor_settles_leave_exact_caches(engine, prompt, reference):
    """Every cycle after the first is built and queued before the one before it syncs, whatever
    that one keeps: misses at every position, past the window, past a move of the sliding
    buffers (every 256 positions) and a growth of the full ones (512). After each generation,
    and after callers leaving mid-answer, the caches hold exactly a fresh pass's keys and
    values."""
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=0.25, seed=5, strict=False)
    decoder = engine.decoder(drafter=drafter, draft_tokens=6)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt)
    for i in range(10):
        before = decoder.stats.cycles, decoder.stats.prebuilt
        taken = []
        for report in decoder.generate(state, 70):
            taken.append(report.token)
            if i % 3 == 2 and len(taken) == 23 + i:  # the caller leaves mid-answer
                break
        cycles, prebuilt = decoder.stats.cycles - before[0], decoder.stats.prebuilt - before[1]
        if i % 3 != 2:
            assert prebuilt == cycles - 1 and cycles > 10
        assert_caches_match_a_fresh_pass(engine.target, state)
    assert len(state.tokens) > 512 + 40 and 0 < decoder.stats.kept < decoder.stats.drafted
    assert set(decoder.stats.kept_by_position) != {0}


def test_numpy_prompts_and_settings(engine, prompt):
    a = engine.generate(np.array(prompt), max_tokens=5, top_k=np.int64(0), seed=np.int64(3))
    b = engine.generate(prompt, max_tokens=5)
    assert a.tokens == b.tokens


@pytest.mark.parametrize("g, break_probability", [(1, 0.12), (3, 0.3), (6, 0.5)])
def test_every_cycle_is_built_ahead_whatever_its_predecessor_keeps(engine, prompt, reference, g, break_probability):
    """The next cycle is built from the running cycle's lazy outputs and queued behind it,
    whatever it keeps: only the first cycle is built after a sync, and the device never waits
    for the host between two cycles. The tokens are the target's own."""
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=break_probability, seed=g)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=g)
    assert result.tokens == reference[len(prompt) :]
    assert 0 < result.stats.kept < result.stats.drafted  # hits and misses both happened
    assert result.stats.prebuilt == result.stats.cycles - 1 and result.stats.exposed_host_seconds == 0
    assert result.stats.host_syncs == result.stats.cycles


def test_the_next_cycle_is_built_between_the_stages_of_the_running_one(engine, prompt, reference, monkeypatch):
    """MLX keeps only a few tasks in flight, so the host is free only while the last of a
    launch run: the running cycle is launched a draft step at a time, and a step of the next
    one is built after each. The tokens stay the target's."""
    log = []
    launch = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (log.append("launch"), launch(*a))[1])
    drafter = StepwiseDrafter(reference, tiny.VOCAB, break_probability=0.2, seed=3, log=log)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=4)
    assert result.tokens == reference[len(prompt) :]
    assert result.stats.prebuilt == result.stats.cycles - 1
    assert " ".join(["launch", "piece"] * 4) in " ".join(log)


def test_mtp_off_queues_each_pass_before_the_sync(engine, prompt, reference):
    result = engine.generate(prompt, max_tokens=50, mtp=False)
    assert result.stats.prebuilt == result.stats.cycles - 1 and result.stats.exposed_host_seconds == 0


def test_the_host_clock_by_kind_covers_every_cycle(engine, prompt, reference, monkeypatch):
    """The statistics split the loop's host time into building, launching and waiting, and
    each second of it is some step's own (what the draft lengths weigh): the steps' times, a
    step built ahead and dropped at the end included, add up to exactly the three."""
    from mlx_spec.decoding.launch import Launcher

    steps, build, advance = [], Launcher.build, Launcher.advance

    def recorded(method):
        def call(self, *args):
            step = method(self, *args)
            if step is not None:
                steps.append(step)
            return step
        return call

    monkeypatch.setattr(Launcher, "build", recorded(build))
    monkeypatch.setattr(Launcher, "advance", recorded(advance))
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=0.3, seed=5)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter, draft_tokens=3)
    s = result.stats
    assert result.tokens == reference[len(prompt) :]
    assert s.build_seconds > 0 and s.launch_seconds > 0 and len(steps) >= s.cycles > 10
    clock = s.build_seconds + s.launch_seconds + s.waited_seconds
    assert sum(step.seconds for step in steps) == pytest.approx(clock, rel=1e-9)
    assert clock <= s.generation_seconds
    assert s.build_ms == pytest.approx(1000 * s.build_seconds / s.cycles)
    assert s.launch_ms == pytest.approx(1000 * s.launch_seconds / s.cycles)


def test_a_drafter_that_reads_the_tokens_waits_for_them(engine, prompt, reference):
    """Prompt lookup reads the tokens' values: a cycle after one it guessed is built after the
    sync (the chain's MTP member drafts the others ahead)."""
    from mlx_spec.drafting import Chain, PromptLookup

    repeated = prompt + prompt[:20]  # the answer's start repeats the prompt: lookup guesses
    chain = Chain([PromptLookup(), engine.mtp_drafter])
    result = engine.generate(repeated, max_tokens=60, drafter=chain, draft_tokens=4)
    assert result.tokens == engine.generate(repeated, max_tokens=60, mtp=False).tokens
    lookup_cycles = result.stats.drafted_by_source.get("lookup", 0)
    assert lookup_cycles > 0 and result.stats.prebuilt < result.stats.cycles - 1


@pytest.mark.parametrize("sampled", [False, True])
def test_guesses_outside_the_vocabulary_are_never_kept(engine, prompt, sampled):
    class OutOfRange:
        def draft(self, context, g):
            from mlx_spec.drafting import Draft

            guesses = mx.array([tiny.VOCAB + 7, -3][:g] + [0] * max(g - 2, 0), dtype=mx.int32)
            q = mx.full((g, tiny.VOCAB), 1.0 / tiny.VOCAB) if sampled else None
            return Draft(guesses, q=q)

    settings = dict(temperature=1.0, seed=4) if sampled else {}
    off = engine.generate(prompt, max_tokens=40, mtp=False, **settings)
    on = engine.generate(prompt, max_tokens=40, drafter=OutOfRange(), draft_tokens=2, **settings)
    assert on.stats.kept == 0 and on.stats.drafted > 0
    if not sampled:  # the ratio rule draws corrections from other uniforms: same law, other tokens
        assert on.tokens == off.tokens


def boundary_stop(steps):
    """A stop string made of the end of one answer token's text and the start of the next's,
    and the text before it."""
    text, ends = "", []
    for s in steps:
        text += s.text or ""
        ends.append(len(text))
    for i in range(5, len(steps) - 1):
        a, b = steps[i].text or "", steps[i + 1].text or ""
        if steps[i].channel == steps[i + 1].channel == "answer" and len(a) >= 2 and len(b) >= 2:
            stop = a[-2:] + b[:2]
            return stop, text[: text.index(stop)]
    raise AssertionError(f"no two neighbouring answer tokens of two characters in {text!r}")


@pytest.mark.parametrize("mtp", [False, None])
def test_stop_strings_across_token_boundaries(engine, prompt, mtp):
    full = engine.generate(prompt, max_tokens=60, mtp=False)
    stop, before = boundary_stop(full.steps)
    cut = engine.generate(prompt, max_tokens=60, mtp=mtp, stop=["never written", stop])
    assert cut.finish_reason == "stop" and cut.text == before and stop not in cut.text
    assert cut.tokens == full.tokens[: len(cut.tokens)] and len(cut.tokens) < len(full.tokens)
    # Streamed, the same text comes out token by token, and nothing of the stop string.
    streamed = engine.stream(prompt, max_tokens=60, mtp=mtp, stop=stop)
    assert "".join(r.text or "" for r in streamed) == before and streamed.result.text == before
    # A stop string the answer never writes changes nothing.
    assert engine.generate(prompt, max_tokens=60, stop=["\x00never"]).tokens == full.tokens


class KnowsTheAnswer:
    """A custom drafter through the documented draft(context, g) API, declaring nothing: it
    reads the settled tokens and guesses the reference's continuation after them."""

    def __init__(self, reference):
        self.reference = reference

    def draft(self, context, g):
        from mlx_spec.drafting import Draft

        assert len(context.tokens) == context.position + 1  # never asked ahead of the host
        at = len(context.tokens)
        return Draft(mx.array(self.reference[at : at + g], dtype=mx.int32))


def test_a_custom_drafter_that_reads_the_tokens_keeps_every_right_guess(engine, prompt, reference):
    """Drafting ahead is opted into: a drafter that declares nothing is always given the
    settled tokens, so a drafter that knows the answer keeps every guess."""
    result = engine.generate(prompt, max_tokens=LONG - 5, drafter=KnowsTheAnswer(reference), draft_tokens=6)
    assert result.tokens == reference[len(prompt) : len(prompt) + LONG - 5]
    assert result.stats.drafted > 150 and result.stats.kept == result.stats.drafted


class Witness(ScriptedDrafter):
    """A scripted drafter that records the per-sequence calls it gets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls_log = []

    def begin(self, sequence):
        self.calls_log.append(("begin", sequence, list(sequence.tokens)))

    def accept(self, sequence, tokens):
        assert sequence.tokens[-len(tokens) :] == tokens
        self.calls_log.append(("accept", sequence, list(tokens)))


def test_a_drafter_gets_begin_and_accept_per_sequence(engine, prompt, reference):
    """As llama.cpp's speculative states: each generation begins on its sequence, and every
    settled run of tokens is accepted on it, in order, while two sequences alternate."""
    witness = Witness(reference, tiny.VOCAB, break_probability=0.3, seed=2, strict=False)
    decoder = engine.decoder(drafter=witness, draft_tokens=4)
    states = [SequenceState(engine.target), SequenceState(engine.target)]
    other = prompt[::-1]
    decoder.add_tokens(states[0], prompt)
    decoder.add_tokens(states[1], other)
    for turn in range(4):
        state = states[turn % 2]
        witness.calls_log.clear()
        before = list(state.tokens)
        out = [r.token for r in decoder.generate(state, 25)]
        kinds = [c[0] for c in witness.calls_log]
        assert kinds[0] == "begin" and kinds.count("begin") == 1
        assert witness.calls_log[0][1] is state and witness.calls_log[0][2] == before
        assert all(c[1] is state for c in witness.calls_log)
        assert sum((c[2] for c in witness.calls_log[1:]), []) == out


def test_a_text_prompt_that_starts_with_bos_gets_no_second_one(checkpoints, tmp_path):
    """A raw prompt a client rendered itself (`/v1/completions`, `generate --raw`) starts with
    <bos>; a tokenizer that adds one, as Gemma's do, made it two (found by a review; mlx-lm's
    server guards the same way). A prompt without it still gets the tokenizer's."""
    import json
    import shutil

    folder = tmp_path / "adds-bos"
    shutil.copytree(checkpoints["text"], folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    text = load(str(folder), drafter=None).text
    plain = text.encode("Hello there")
    assert plain[0] == 2 and plain.count(2) == 1
    assert text.encode("<bos>Hello there") == plain
