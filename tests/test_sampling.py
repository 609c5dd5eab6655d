"""Sampling is exact: the tokens come out exactly as often as the target alone would produce
them, whatever the drafter guesses. Chi-square tests at significance 0.001, fixed seeds."""

import copy

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chi2

import tiny
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.drafting import MTPDrafter
from mlx_spec.sampling.settings import SamplingSettings
from mlx_spec.sampling.acceptance import accept_by_match, accept_by_ratio
from mlx_spec.sampling.distribution import distribution
from scripted import ScriptedDrafter
from kv import fresh_cache

ALPHA = 0.001  # reject "same distribution" below this p-value
SETTINGS = [dict(temperature=0.7, top_k=40, top_p=0.9), dict(temperature=1.0, top_k=64, top_p=0.95)]


def chi_square_p(counts, probs, min_expected=5.0):
    """Goodness of fit of observed `counts` to `probs`; bins expected < 5 are pooled."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, "a token with probability zero was produced"
    expected = probs * n
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    return chi2.sf(stat, keep.sum() - 1)


def reference_distribution(logits, temperature, top_k, top_p):
    """Temperature, top-k, top-p written out in numpy, independently of mlx-spec."""
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    mass_before = np.cumsum(p) - p
    p = np.where(mass_before < top_p, p, 0)
    out = np.zeros_like(z)
    out[order] = p / p.sum()
    return out


@pytest.mark.parametrize("settings", SETTINGS + [dict(temperature=1.3, top_k=0, top_p=1.0)])
def test_distribution_matches_numpy(settings):
    logits = np.random.default_rng(0).standard_normal((3, tiny.VOCAB)).astype(np.float32) * 2
    dist = distribution(mx.array(logits), SamplingSettings(**settings))
    dense = np.array(dist.dense(tiny.VOCAB))
    top_k = settings["top_k"] or tiny.VOCAB
    for row, got in zip(logits, dense):
        np.testing.assert_allclose(got, reference_distribution(row, settings["temperature"], top_k, settings["top_p"]), atol=1e-6)
    assert np.array_equal(np.array(dist.count), (dense > 0).sum(-1))


def test_greedy_ties_go_to_the_lowest_id():
    logits = mx.array([[0.0, 2.0, 1.0, 2.0], [3.0, 3.0, 3.0, 0.0]])
    dist = distribution(logits, SamplingSettings())
    assert dist.sample(mx.array([[0.99, 0.3], [0.5, 0.9]])).tolist() == [1, 0]


def test_the_far_tail_of_a_large_vocabulary_is_drawn():
    """262,144 tokens, one holding nearly all the mass: each other token has p ~ 2e-9, below
    float32's step near 1.0, yet together they hold ~5e-4. Uniforms that fall in that tail's
    share must spread over the tail's tokens, not pile onto one (as a single float32 cumulative
    sum would)."""
    vocab, batch = 262_144, 64
    logits = mx.zeros((batch, vocab)).at[:, 0].add(20.0)
    dist = distribution(logits, SamplingSettings(temperature=1.0))
    tail_mass = 1 - float(np.array(dist.probs[0, 0]))
    exact = (vocab - 1) * np.exp(-20.0) / (1 + (vocab - 1) * np.exp(-20.0))
    assert abs(tail_mass - exact) < 1e-3 * exact + 1e-7
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(16):
        first = 1 - tail_mass * rng.random(batch) * 0.999  # inside the tail's share
        u = mx.array(np.stack([first, rng.random(batch)], axis=-1).astype(np.float32))
        draws += np.array(dist.sample(u)).tolist()
    assert 0 not in draws
    assert len(set(draws)) > 0.95 * len(draws)
    # Spread over the whole tail: draws land in every eighth of the vocabulary.
    assert len(set(np.array(draws) * 8 // vocab)) == 8


def test_empty_residual_falls_back_to_the_target():
    """If rounding makes q >= p everywhere, a rejection must still draw from p, never a token
    that p rules out."""
    n = 2000
    logits = mx.broadcast_to(mx.array([[4.0, 3.0, -5.0, -6.0], [1.0, 1.0, 1.0, 1.0]]), (n, 2, 4))
    target = distribution(logits, SamplingSettings(temperature=1.0, top_k=2))
    p = np.array(target.dense(4))[0, 0]
    q = mx.broadcast_to(mx.array((p * (1 + 3e-7)).astype(np.float32)), (n, 1, 4))
    u = mx.random.uniform(shape=(n, 4), key=mx.random.key(1))
    always_reject = mx.full((n, 1), 0.9999999)
    kept, tokens = accept_by_ratio(target, mx.zeros((n, 1), mx.int32), q, always_reject, u[:, None, :2], u[:, 2:])
    assert np.array(kept).sum() < n  # rejections happened
    assert set(np.array(tokens)[:, 0].tolist()) <= {0, 1}


def test_named_presets():
    assert SamplingSettings.named("gemma") == SamplingSettings(1.0, 64, 0.95)
    assert SamplingSettings.named("greedy").greedy


# -- the acceptance rules on their own, at scale ------------------------------------------------


def verify_logits(engine, prompt, guesses):
    """The target's logits at the g + 1 verified positions (prompt's last token + guesses)."""
    cache = fresh_cache(engine.target)
    tokens = mx.array([prompt + guesses])
    logits, _ = engine.target(tokens, cache)
    return logits[0, len(prompt) - 1 :]


@pytest.fixture(scope="module")
def prompt():
    return np.random.RandomState(1).randint(0, tiny.VOCAB, size=3 * tiny.WINDOW).tolist()


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("rule", ["match", "ratio"])
def test_acceptance_rules_keep_the_target_distribution(engine, prompt, settings, rule):
    """200,000 cycles of one verified pass with g = 1: the first token follows p_0, and after a
    kept guess the bonus token follows p_1, for guesses that are likely, unlikely, or drawn."""
    n = 200_000
    s = SamplingSettings(**settings)
    p0 = np.array(distribution(verify_logits(engine, prompt, [])[0], s).dense(tiny.VOCAB))
    guess = int(np.argmax(p0))  # the most likely token, so that many are kept
    logits = verify_logits(engine, prompt, [guess])
    target = distribution(mx.broadcast_to(logits, (n, *logits.shape)), s)
    p = np.array(distribution(logits, s).dense(tiny.VOCAB))
    key = mx.random.key(11 if rule == "match" else 12)
    u = mx.random.uniform(shape=(n, 4, 2), key=key)
    if rule == "match":
        guesses = mx.full((n, 1), guess, dtype=mx.int32)
        kept, tokens = accept_by_match(target, guesses, u[:, :2])
    else:
        # A drafter distribution q near p but not p (q > p on some tokens, q < p on others,
        # and q > 0 where p = 0): the rule must correct for the difference.
        q = 0.6 * p[0] + 0.3 * np.roll(p[0], 1) + 0.1 / tiny.VOCAB
        cdf = np.cumsum(q)
        guesses = np.minimum(np.searchsorted(cdf, np.array(u[:, 3, 0]) * cdf[-1], side="right"), tiny.VOCAB - 1)
        guesses = mx.array(guesses.astype(np.int32))[:, None]
        q_all = mx.broadcast_to(mx.array(q.astype(np.float32)), (n, 1, tiny.VOCAB))
        kept, tokens = accept_by_ratio(target, guesses, q_all, u[:, 0:1, 0], u[:, 1:2], u[:, 2])
        assert p[0][np.array(guesses)[:, 0]].max() > 0
    kept, tokens = np.array(kept), np.array(tokens)
    first = np.bincount(tokens[:, 0], minlength=tiny.VOCAB)
    assert chi_square_p(first, p[0]) > ALPHA
    bonus = np.bincount(tokens[kept == 1, 1], minlength=tiny.VOCAB)
    assert bonus.sum() > 1000
    assert chi_square_p(bonus, p[1]) > ALPHA


# -- end to end: the engine's first generated tokens -------------------------------------------


def fork(state):
    """An independent copy of a prefilled state (the cache buffers are copied, not shared)."""
    copied = copy.copy(state)
    copied.cache = []
    for c in state.cache:
        c2 = copy.copy(c)
        c2.keys, c2.values = mx.array(c.keys), mx.array(c.values)
        copied.cache.append(c2)
    copied.tokens = list(state.tokens)
    copied.ngrams = copy.deepcopy(state.ngrams)
    return copied


def first_tokens(engine, prompt, settings, drafter, samples, g=2):
    base = SequenceState(engine.target)
    engine.decoder(mtp=False).add_tokens(base, prompt)
    out = []
    for seed in range(samples):
        decoder = engine.decoder(seed=seed, drafter=drafter, draft_tokens=g, report=False, **settings)
        out.append([r.token for r in decoder.generate(fork(base), 2)])
    return np.array(out)


END_TO_END = [
    (SETTINGS[0], "likely"),
    (SETTINGS[0], "breaking"),
    (SETTINGS[1], "likely"),
    (SETTINGS[1], "breaking"),
    (SETTINGS[1], "mtp-sampled"),
    (SETTINGS[1], "lookup"),
]


def exact_first_two(engine, prompt, s):
    """The target's exact distributions of the first token and of the second token."""
    p0 = np.array(distribution(verify_logits(engine, prompt, [])[0], s).dense(tiny.VOCAB))
    p1 = np.zeros(tiny.VOCAB)
    for first in np.nonzero(p0)[0]:
        logits = verify_logits(engine, prompt + [int(first)], [])[0]
        p1 += p0[first] * np.array(distribution(logits, s).dense(tiny.VOCAB))
    return p0, p1


@pytest.mark.parametrize("settings, drafter_kind", END_TO_END)
def test_engine_first_tokens_follow_the_target(engine, prompt, settings, drafter_kind):
    """1,000 seeded generations per case (6,000 in all): the engine's first and second tokens
    follow the target's own distributions (a chi-square test at ALPHA, which finds the wiring
    errors this test is for: a guess kept or a token drawn from the wrong distribution moves
    tenths of the mass; the acceptance rules' own fine statistics are
    test_acceptance_rules_keep_the_target_distribution's 200,000 draws per case). "likely" guesses the greedy continuation (often
    kept), "breaking" the same with its first guess spoiled (never kept), "mtp-sampled" draws
    its guesses from the tiny MTP assistant's own distribution (the min(1, p/q) rule), "lookup"
    copies from a prompt that repeats itself."""
    s = SamplingSettings(**settings)
    if drafter_kind == "lookup":
        prompt = prompt[: tiny.WINDOW] * 3  # a prompt that repeats itself, so lookup guesses
    p0, p1 = exact_first_two(engine, prompt, s)
    if drafter_kind == "mtp-sampled":
        drafter = MTPDrafter(engine.assistant, engine.target, sample=True)
    elif drafter_kind == "lookup":
        drafter = engine.lookup
    else:
        greedy = engine.generate(prompt, max_tokens=3, mtp=False).tokens
        break_at = 0 if drafter_kind == "breaking" else None
        drafter = ScriptedDrafter(prompt + greedy, tiny.VOCAB, break_at=break_at, strict=False)
    tokens = first_tokens(engine, prompt, settings, drafter, 1_000)
    assert chi_square_p(np.bincount(tokens[:, 0], minlength=tiny.VOCAB), p0) > ALPHA
    assert chi_square_p(np.bincount(tokens[:, 1], minlength=tiny.VOCAB), p1) > ALPHA


def test_the_smallest_temperature_samples_the_argmax():
    """At the smallest temperature allowed, softcapped logits (up to 30) stay finite once
    scaled: every probability on the best token, none NaN."""
    from mlx_spec.sampling.settings import MIN_TEMPERATURE

    logits = mx.array([[0.5, 30.0, 1.0, -30.0, 29.9]])
    d = distribution(logits, SamplingSettings(temperature=MIN_TEMPERATURE))
    assert d.ids[0, 0].item() == 1 and d.probs[0].tolist()[0] == 1.0 and d.count.item() == 1
