"""The compiled parts of a cycle compute what the plain Python-built graphs compute, and are not
traced again as the context grows.

The loop's target pass and draft step read whole cache buffers through masks (so that their
compiled graphs keep their input shapes from cycle to cycle). The references here are the plain
target pass (mlx-lm's model on our caches, which `test_parity` and `test_family` check against
transformers) and `Assistant.step` on exactly the positions to read."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import tiny
from mlx_spec.models.cache import FullCache
from mlx_spec.drafting import DraftContext, MTPDrafter
from mlx_spec.models import load_drafter, load_target
from mlx_spec.decoding.reports import report_arrays
from mlx_spec.sampling.settings import SamplingSettings
from mlx_spec.sampling.acceptance import accept_by_match, accept_by_ratio
from mlx_spec.sampling.distribution import distribution
from mlx_spec.sampling.uniforms import uniform_streams
from mlx_spec.models.cache import trim_cache
from mlx_spec.decoding.verify import Verifier
from mlx_spec.models.traces import TraceCache
from kv import fresh_cache, prefill, sliced, step_kv

GEMMA = SamplingSettings.named("gemma")
STEPS = 5


def plain_draft(assistant, target, context, steps, settings=None):
    """Draft steps by `Assistant.step` over sliced K/V: guesses, hidden states and q."""
    token, hidden, out = context.last_token, context.hidden, []
    for i in range(steps):
        h, hidden = assistant.step(target.embed(token), hidden, step_kv(assistant, sliced(context.kv)),
                                   mx.array(context.position))
        if settings is None:
            token, q = assistant.greedy_token(h), None
        else:
            dist = distribution(assistant.full_logits(h)[0, 0], settings)
            token, q = dist.sample(context.uniforms[i]).reshape(1, 1), dist.dense(assistant.vocab_size)
        out.append((token.item(), np.array(hidden), None if q is None else np.array(q)))
    return out


def context_after(target, ids, settings, uniforms):
    cache = fresh_cache(target)
    hidden = prefill(target, mx.array([ids[:-1]]), cache, chunk=tiny.WINDOW + 1)
    return DraftContext(ids, mx.array([ids[-1:]]), hidden, target.drafter_buffers(cache), settings, uniforms)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("sampled", [False, True])
def test_compiled_draft_steps_equal_plain_ones(checkpoints, ordered, sampled):
    """Contexts before the sliding window fills, just past it, and after the full cache has grown
    its buffer: the same guesses as the plain step and, sampling, the same q to 1e-5 at every
    step (each step's q is read from its hidden state, which the next step carries: a drift in
    the hidden states shows in the q of the steps after it)."""
    target, _ = load_target(str(checkpoints["text"]))
    assistant, _ = load_drafter(str(checkpoints["assistant" if ordered else "assistant_plain"]))
    settings = GEMMA if sampled else SamplingSettings()
    drafter = MTPDrafter(assistant, target, sample=sampled)
    uniforms = mx.random.uniform(shape=(STEPS, 2), key=mx.random.key(3))
    for length in (tiny.WINDOW - 4, tiny.WINDOW + 2, 300):
        ids = np.random.RandomState(length).randint(0, tiny.VOCAB, size=length).tolist()
        context = context_after(target, ids, settings, uniforms)
        full = context.kv["full_attention"]
        assert full.hi < full.keys.shape[-2] or length < 300  # masked slots are really there
        expected = plain_draft(assistant, target, context, STEPS, settings if sampled else None)
        draft = drafter.draft(context, STEPS)
        assert draft.tokens.tolist() == [t for t, _, _ in expected]
        if sampled:
            assert np.abs(np.array(draft.q) - np.stack([q for _, _, q in expected])).max() <= 1e-5


def test_the_draft_step_is_traced_again_only_when_a_buffer_grows(engine, monkeypatch):
    """Generating far past the window and past a buffer growth of the full cache, the compiled
    draft step is traced once per buffer shape, not per token."""
    traces = []
    traced = MTPDrafter._argmax_step

    def counting(self, *args):
        traces.append(tuple(a.shape for a in args[3:9]))  # (token, hidden, position, *K/V)
        return traced(self, *args)

    monkeypatch.setattr(MTPDrafter, "_argmax_step", counting)
    drafter = MTPDrafter(engine.mtp_drafter.assistant, engine.target)
    decoder = engine.decoder(drafter=drafter, draft_tokens=3)
    from mlx_spec.decoding.sequence import SequenceState

    state = SequenceState(engine.target)
    decoder.add_tokens(state, list(range(1, 40)))
    for _ in decoder.generate(state, 600):
        pass
    shapes = set(traces)
    assert decoder.stats.cycles > 100
    assert len(traces) == len(shapes)  # never traced twice for the same shapes
    assert len(shapes) <= 5


@pytest.mark.parametrize("settings", [SamplingSettings(), GEMMA, SamplingSettings(0.7, 0, 0.5)])
@pytest.mark.parametrize("g", [0, 1, 6])
def test_compiled_verification_equals_plain(settings, g):
    """Acceptance (both rules) and every report figure, against the uncompiled functions."""
    rng = np.random.RandomState(g)
    logits = mx.array(rng.normal(size=(g + 1, tiny.VOCAB)).astype(np.float32) * 3)
    guesses = mx.array(rng.randint(0, tiny.VOCAB, size=g).astype(np.int32))
    streams = uniform_streams(5)
    uniforms = streams["target"].take(0, g + 1)
    dist = distribution(logits, settings)
    kept, tokens = accept_by_match(dist, guesses, uniforms)
    expected = {"kept": kept, "tokens": tokens, **report_arrays(logits, dist, tokens)}
    kept, tokens, reports = Verifier(settings, True, TraceCache()).by_match(logits, guesses, uniforms)
    assert_same(expected, {"kept": kept, "tokens": tokens, **reports})

    assert Verifier(settings, False, TraceCache()).by_match(logits, guesses, uniforms)[2] == {}
    if g == 0:
        return  # no guesses, no q: the loop verifies by match
    q = mx.softmax(mx.array(rng.normal(size=(g, tiny.VOCAB)).astype(np.float32)), axis=-1)
    ratio = (guesses, q, streams["accept"].take(0, g)[:, 0], streams["residual"].take(0, g), uniforms[-1])
    kept, tokens = accept_by_ratio(dist, *ratio)
    expected = {"kept": kept, "tokens": tokens, **report_arrays(logits, dist, tokens)}
    kept, tokens, reports = Verifier(settings, True, TraceCache()).by_ratio(logits, *ratio)
    assert_same(expected, {"kept": kept, "tokens": tokens, **reports})


def assert_same(expected, got):
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        assert np.allclose(np.array(value), np.array(got[name]), rtol=1e-6, atol=1e-7), name


def test_compiled_steps_start_afresh_past_the_trace_limit(engine, monkeypatch):
    """Buffer sizes depend on where each conversation's caches grew, so a server sees ever new
    ones: past the bound the least recently used compiled steps are dropped and traced again
    when needed, and the tokens stay the target's."""
    from mlx_spec.models.traces import TraceCache

    drafter = MTPDrafter(engine.mtp_drafter.assistant, engine.target)
    drafter.traces = TraceCache(bound=1)  # its own, not the target's shared one
    from mlx_spec.decoding.sequence import SequenceState

    def tokens(**kwargs):
        decoder = engine.decoder(**kwargs)
        state = SequenceState(engine.target)
        decoder.add_tokens(state, list(range(1, 40)))
        return [r.token for r in decoder.generate(state, 300)]

    assert tokens(drafter=drafter, draft_tokens=3) == tokens(mtp=False)
    assert len(drafter.traces) == 1


def walk(target, seed: int, length: int = 600):
    """Passes of 1 to 9 positions, each cut back by a random number of them (none to all), through
    two sequences, one fed by the plain pass and one by the loop's compiled pass as the one row of
    its storage: past the sliding window, across its ring's wrap and past the full buffers'
    growth at 512 positions. Yields both passes' (logits, hidden) and the storage."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, tiny.VOCAB, length + 10).tolist()
    plain, own = target.make_cache(max_trim=34), target.make_cache(max_trim=34)
    for cache in (plain, own):
        prefill(target, mx.array([ids[:20]]), cache)
    storage = target.batch_caches(max_trim=34, max_pass=17)
    storage.add(own)
    position = 20
    while position < length:
        n = int(rng.integers(1, 10))
        tokens = mx.array([ids[position : position + n]])
        yield target(tokens, plain), target.forward_batch(tokens, storage), storage
        keep = int(rng.integers(0, n + 1))
        trim_cache(plain, n - keep)
        storage.trim(0, n - keep)
        position += keep


def quantized_4_bits(target):
    nn.quantize(target.model, group_size=32, bits=4,
                class_predicate=lambda _, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % 32 == 0)
    mx.eval(target.model.parameters())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "4-bit"])
def test_compiled_target_pass_equals_plain(checkpoints, dtype):
    """Bit for bit: the same logits and hidden states as the plain pass, at every offset."""
    target, _ = load_target(str(checkpoints["text"]))
    if dtype == "bfloat16":
        target.model.set_dtype(mx.bfloat16)
    elif dtype == "4-bit":
        quantized_4_bits(target)
    passes = 0
    for (plain_logits, plain_hidden), (logits, hidden), storage in walk(target, seed=len(dtype)):
        assert mx.array_equal(plain_logits, logits) and mx.array_equal(plain_hidden, hidden), passes
        passes += 1
    assert passes > 150 and storage.capacity > 512  # the full buffers grew


@pytest.mark.parametrize("variant", ["e4b", "26b-a4b", "31b", "12b", "12b-kv-shared"])
def test_compiled_target_pass_equals_plain_for_every_size(family, variant):
    """Mixture of experts, keys equal to values, no K/V sharing, the 12B's classes: the same as the
    plain pass."""
    target, _ = load_target(str(family(variant)["target"]))
    for (plain_logits, plain_hidden), (logits, hidden), _ in walk(target, seed=1, length=120):
        assert mx.array_equal(plain_logits, logits) and mx.array_equal(plain_hidden, hidden)


def test_the_target_pass_is_traced_again_only_for_new_shapes(engine, monkeypatch):
    """Generating 600 tokens, with draft lengths chosen as the loop goes (every pass length from
    1 to 9 positions), the compiled pass is traced once per input length and buffer shapes."""
    from mlx_spec.decoding.sequence import SequenceState
    from mlx_spec.models.batch_pass import BatchPass
    from mlx_spec.models.traces import TraceCache

    traces = []
    traced = BatchPass._pass

    def counting(self, rings, windows):
        run = traced(self, rings, windows)

        def recording(tokens, offsets, *buffers):
            traces.append((tokens.shape, tuple(b.shape for b in buffers)))
            return run(tokens, offsets, *buffers)

        return recording

    monkeypatch.setattr(BatchPass, "_pass", counting)
    monkeypatch.setattr(engine.target, "_batch_pass", BatchPass(engine.target, TraceCache()))  # traces of its own
    decoder = engine.decoder(draft_tokens=None)
    state = SequenceState(engine.target)
    decoder.add_tokens(state, list(range(1, 40)))
    for _ in decoder.generate(state, 600):
        pass
    assert decoder.stats.cycles > 100 and traces
    assert len(traces) == len(set(traces))  # never traced twice for the same shapes
    lengths = {shape[1] for shape, _ in traces}
    assert len(traces) <= 3 * len(lengths)  # a few buffer shapes per input length


def test_the_target_pass_starts_afresh_past_the_trace_limit(engine, monkeypatch):
    from mlx_spec.decoding.sequence import SequenceState
    from mlx_spec.models.batch_pass import BatchPass
    from mlx_spec.models.traces import TraceCache

    compiled = BatchPass(engine.target, TraceCache(bound=1))
    monkeypatch.setattr(engine.target, "_batch_pass", compiled)

    def tokens(**kwargs):
        decoder = engine.decoder(**kwargs)
        state = SequenceState(engine.target)
        decoder.add_tokens(state, list(range(1, 40)))
        return [r.token for r in decoder.generate(state, 300)]

    assert tokens(draft_tokens=3) == tokens(mtp=False)
    assert len(compiled.traces) == 1


def test_compiled_functions_held_stay_under_their_bound(checkpoints, monkeypatch):
    """A long-running server is sent settings nobody foresaw: distinct (temperature, top-k,
    top-p) through one engine, each with its own compiled verification and draft steps, leave
    no more compiled functions held than the bound in their one owner (the target), and the
    latest settings still decode exactly. (The bound is cut from traces.MAX_TRACES to 24 here,
    so that filling it takes 40 settings, not 200.)"""
    from mlx_spec import load
    from mlx_spec.models.traces import TraceCache
    from mlx_spec.drafting import MTPDrafter

    monkeypatch.setattr(TraceCache.__init__, "__defaults__", (24,))
    engine = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    sampled = MTPDrafter(engine.mtp_drafter.assistant, engine.target, sample=True)
    prompt = list(range(1, 30))
    for i in range(40):
        settings = dict(temperature=0.5 + i / 100, top_k=i % 7, top_p=1 - i / 1000, seed=i)
        engine.generate(prompt, max_tokens=3, draft_tokens=2, drafter=sampled if i % 2 else None, **settings)
    owner = engine.target.traces
    assert sampled.traces is owner and engine.mtp_drafter.traces is owner and engine.target._batch_pass.traces is owner
    assert len(owner) == owner.bound == 24  # it did fill up: the bound was what held it
    last = dict(temperature=0.5 + 39 / 100, top_k=39 % 7, top_p=1 - 39 / 1000, seed=39)
    assert engine.generate(prompt, max_tokens=12, **last).tokens == engine.generate(prompt, max_tokens=12, mtp=False, **last).tokens


def test_rows_of_the_storage_give_the_plain_pass_bit_for_bit(checkpoints):
    """Three sequences at different offsets, one past the full buffers' growth, in one storage:
    every pass over all of them (1 to 9 positions each, each row then cut back by its own
    random number) gives each row exactly the logits and hidden states of its plain pass alone."""
    target, _ = load_target(str(checkpoints["text"]))
    rng = np.random.default_rng(0)
    lengths = [20, 60, 300]
    ids = [rng.integers(0, tiny.VOCAB, 900).tolist() for _ in lengths]
    plains = [target.make_cache(34) for _ in lengths]
    storage = target.batch_caches(max_trim=34, max_pass=17)
    for plain, n, row in zip(plains, lengths, ids):
        own = target.make_cache(34)
        for cache in (plain, own):
            prefill(target, mx.array([row[:n]]), cache)
        storage.add(own)
    positions = list(lengths)
    for step in range(120):
        n = int(rng.integers(1, 10))
        logits, hidden = target.forward_batch(mx.array([row[p : p + n] for row, p in zip(ids, positions)]), storage)
        for r, (row, p) in enumerate(zip(ids, positions)):
            plain_logits, plain_hidden = target(mx.array([row[p : p + n]]), plains[r])
            assert mx.array_equal(plain_logits[0], logits[r]) and mx.array_equal(plain_hidden[0], hidden[r]), (step, r)
            keep = int(rng.integers(0, n + 1))
            trim_cache(plains[r], n - keep)
            storage.trim(r, n - keep)
            positions[r] += keep
    assert storage.capacity > 512 and min(positions) > 2 * tiny.WINDOW


def test_full_caches_grow_to_whole_steps_in_prefill_too(checkpoints):
    """A second prompt goes through the plain pass: the full cache still grows to a multiple of
    its step, so every conversation's rows in the loop's storage have the same few widths."""
    target, _ = load_target(str(checkpoints["text"]))
    cache = fresh_cache(target)
    ids = np.random.default_rng(1).integers(0, tiny.VOCAB, 1300).tolist()
    prefill(target, mx.array([ids[:300]]), cache)
    target.forward(mx.array([ids[300:303]]), cache)
    prefill(target, mx.array([ids[303:1300]]), cache)
    full = [c for c in cache if isinstance(c, FullCache)]
    assert full and all(c.keys.shape[2] == 1536 for c in full), [c.keys.shape[2] for c in full]
