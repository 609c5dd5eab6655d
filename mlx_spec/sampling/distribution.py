"""The target's sampling distribution: temperature, then top-k, then top-p (the smallest set of
the most likely tokens whose mass reaches top_p, the token that crosses it included),
renormalised. Temperature 0 means greedy: argmax, ties to the lowest id.

Everything here runs on the device over a batch of positions (the g + 1 positions of one
verification pass), so a whole cycle stays one lazy graph. Sums and draws over the 262,144-token
vocabulary go in blocks, so that float32 keeps the tail (`ascending_total`, `inverse_cdf`).
"""

from dataclasses import dataclass

import mlx.core as mx

from .settings import SamplingSettings


@dataclass
class Distribution:
    """The sampling distribution at each position, as a sorted candidate list.

    ids, probs: [..., C], most likely first; probs are zero past the top-p cut and sum to one.
    count: [...], how many candidates have non-zero probability.
    """

    ids: mx.array
    probs: mx.array
    count: mx.array

    def sample(self, uniforms: mx.array) -> mx.array:
        """One token per position; uniforms [..., 2] in [0, 1) (see `inverse_cdf`)."""
        index = inverse_cdf(self.probs, uniforms)
        return mx.take_along_axis(self.ids, index[..., None], axis=-1)[..., 0]

    def prob_of(self, tokens: mx.array) -> mx.array:
        return mx.where(self.ids == tokens[..., None], self.probs, 0).sum(axis=-1)

    def dense(self, vocab_size: int) -> mx.array:
        """The distribution over the whole vocabulary [..., V]."""
        out = mx.zeros((*self.ids.shape[:-1], vocab_size), dtype=self.probs.dtype)
        return mx.put_along_axis(out, self.ids, self.probs, axis=-1)


def distribution(logits: mx.array, settings: SamplingSettings) -> Distribution:
    """The sampling distribution of `logits` [..., V] under `settings`."""
    logits = logits.astype(mx.float32)
    if settings.greedy:
        ids = mx.argmax(logits, axis=-1)[..., None].astype(mx.int32)
        ones = mx.ones(ids.shape, dtype=mx.float32)
        return Distribution(ids, ones, mx.ones(ids.shape[:-1], dtype=mx.int32))
    scaled = logits / settings.temperature
    vocab = scaled.shape[-1]
    if 0 < settings.top_k < vocab:
        # Only the k best need sorting; the rest of the vocabulary is out anyway.
        ids = mx.argpartition(-scaled, kth=settings.top_k - 1, axis=-1)[..., : settings.top_k]
        values = mx.take_along_axis(scaled, ids, axis=-1)
    else:
        ids, values = mx.broadcast_to(mx.arange(vocab), scaled.shape), scaled
    order = mx.argsort(-values, axis=-1)
    ids = mx.take_along_axis(ids, order, axis=-1)
    values = mx.take_along_axis(values, order, axis=-1)
    weights = mx.exp(values - values[..., :1])
    probs = weights / ascending_total(weights)[..., None]
    if settings.top_p < 1.0:
        mass_before = mx.cumsum(probs, axis=-1) - probs
        probs = mx.where(mass_before < settings.top_p, probs, 0)
        probs = probs / ascending_total(probs)[..., None]
    count = (probs > 0).sum(axis=-1).astype(mx.int32)
    return Distribution(ids.astype(mx.int32), probs, count)


BLOCK = 256


def ascending_total(sorted_weights: mx.array) -> mx.array:
    """Sum over the last axis of weights sorted from large to small, added small to large in
    blocks, so that a long tail of tiny weights is not lost in float32 (softmax's own sum
    drops 262,143 weights of 2e-9 next to one of 1)."""

    def small_first(x):
        return mx.cumsum(x[..., ::-1], axis=-1)[..., -1]

    size = sorted_weights.shape[-1]
    if size <= BLOCK:
        return small_first(sorted_weights)
    pad = -size % BLOCK
    if pad:
        sorted_weights = mx.pad(sorted_weights, [(0, 0)] * (sorted_weights.ndim - 1) + [(0, pad)])
    return small_first(small_first(sorted_weights.reshape(*sorted_weights.shape[:-1], -1, BLOCK)))


def inverse_cdf(weights: mx.array, uniforms: mx.array) -> mx.array:
    """Index drawn in proportion to non-negative `weights` [..., C] (unnormalised is fine).

    Two levels, each with its own uniform (uniforms [..., 2]): first a block of BLOCK entries by
    the blocks' total weights, then an entry inside it. A single float32 cumulative sum over a
    262144-token vocabulary cannot resolve the tail (tokens below float32's step near 1.0
    would never be drawn); over at most BLOCK or C / BLOCK entries it can.
    """
    size = weights.shape[-1]
    if size <= BLOCK:
        return _pick(weights, uniforms[..., 0])
    pad = -size % BLOCK
    if pad:
        weights = mx.pad(weights, [(0, 0)] * (weights.ndim - 1) + [(0, pad)])
    blocks = weights.reshape(*weights.shape[:-1], -1, BLOCK)
    block = _pick(blocks.sum(axis=-1), uniforms[..., 0])
    inside = mx.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
    return block * BLOCK + _pick(inside, uniforms[..., 1])


def _pick(weights: mx.array, u: mx.array) -> mx.array:
    """First index whose cumulative weight exceeds u * total; always one with weight > 0."""
    cdf = mx.cumsum(weights, axis=-1)
    index = (cdf <= u[..., None] * cdf[..., -1:]).sum(axis=-1)
    # u * total can round up to the total: fall back to the last entry with weight.
    last_nonzero = weights.shape[-1] - 1 - mx.argmax((weights > 0)[..., ::-1], axis=-1)
    return mx.minimum(index, last_nonzero).astype(mx.int32)
