"""The trimmable sliding-window cache: attention through it equals attention over the full
history with an explicit window mask, at every step, across many wraps and trims."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_spec.models.cache import SlidingWindowCache

WINDOW, MAX_TRIM, D = 8, 10, 4


def reference_attention(q, keys, values, first_position):
    """Each query (at first_position + i) attends to the last WINDOW positions up to itself."""
    out = []
    for i, qi in enumerate(q):
        p = first_position + i
        lo = max(0, p - WINDOW + 1)
        scores = keys[lo : p + 1] @ qi
        w = np.exp(scores - scores.max())
        out.append((w / w.sum()) @ values[lo : p + 1])
    return np.stack(out)


def attend(cache, q, k, v):
    """As mlx-lm's attention does: the mask first, then update_and_fetch, then SDPA."""
    mask = cache.make_mask(q.shape[0], window_size=WINDOW)
    keys, values = cache.update_and_fetch(mx.array(k)[None, None], mx.array(v)[None, None])
    out = mx.fast.scaled_dot_product_attention(mx.array(q)[None, None], keys, values, scale=1.0, mask=mask)
    return np.array(out)[0, 0]


operations = st.lists(
    st.tuples(st.integers(1, 9), st.integers(0, MAX_TRIM)), min_size=20, max_size=80
)


@settings(max_examples=60, deadline=None)
@given(ops=operations, seed=st.integers(0, 2**16))
def test_attention_through_cache_equals_full_history(ops, seed):
    rng = np.random.default_rng(seed)
    cache = SlidingWindowCache(WINDOW, MAX_TRIM)
    keys = np.zeros((0, D), np.float32)
    values = np.zeros((0, D), np.float32)
    for append, trim in ops:
        q, k, v = (rng.standard_normal((append, D)).astype(np.float32) for _ in range(3))
        first = cache.offset
        keys, values = np.concatenate([keys[:first], k]), np.concatenate([values[:first], v])
        got = attend(cache, q, k, v)
        np.testing.assert_allclose(got, reference_attention(q, keys, values, first), atol=1e-5)
        # Trim as far as the cache promises: up to MAX_TRIM below the furthest position written.
        trim = min(trim, cache.offset - max(0, cache.furthest - MAX_TRIM))
        assert cache.trim(trim) == trim
        # What the drafter reads: the last WINDOW + 1 settled positions, oldest first.
        lo_slot, hi_slot = cache.draft_range()
        dk, dv = cache.keys[..., lo_slot:hi_slot, :], cache.values[..., lo_slot:hi_slot, :]
        lo = max(0, cache.offset - WINDOW - 1)
        np.testing.assert_array_equal(np.array(dk)[0, 0], keys[lo : cache.offset])
        np.testing.assert_array_equal(np.array(dv)[0, 0], values[lo : cache.offset])
        # Memory stays bounded however long it runs.
        assert cache.keys.shape[2] <= WINDOW + 1 + MAX_TRIM + cache.step + 9


def test_trimming_too_far_is_refused():
    cache = SlidingWindowCache(WINDOW, MAX_TRIM)
    for _ in range(5):
        cache.update_and_fetch(mx.zeros((1, 1, 9, D)), mx.zeros((1, 1, 9, D)))
    cache.trim(MAX_TRIM)
    with pytest.raises(ValueError, match="at most 10 below the furthest position written"):
        cache.trim(1)


def test_long_run_stays_bounded():
    cache = SlidingWindowCache(WINDOW, MAX_TRIM)
    for i in range(3000):
        cache.update_and_fetch(mx.ones((1, 1, 3, D)) * i, mx.ones((1, 1, 3, D)))
        cache.trim(2)
    assert cache.offset == 3000
    assert cache.keys.shape[2] <= WINDOW + 1 + MAX_TRIM + cache.step
