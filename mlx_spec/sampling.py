"""Sampling settings, the target's sampling distribution, and the acceptance rules.

Everything here runs on the device over a batch of positions (the g + 1 positions of one
verification pass), so a whole cycle stays one lazy graph.

The sampling distribution: temperature, then top-k, then top-p (the smallest set of the most
likely tokens whose mass reaches top_p, the token that crosses it included), renormalised.
Temperature 0 means greedy: argmax, ties to the lowest id.

Acceptance rules, both exact:
- `accept_by_match`: the target draws its own token at every position from one uniform per
  output index; a guess is kept while it equals that draw. For a deterministic (argmax) guess x
  this accepts with probability p(x) and otherwise yields a draw from p without x, renormalised.
  In greedy mode the draw is the argmax. With the same seed, output equals the target alone's.
- `accept_by_ratio`: for guesses sampled from the drafter's q, keep x with probability
  min(1, p(x) / q(x)); at the first rejection draw from normalise(max(p - q, 0)); after all are
  kept the bonus token is the target's own draw (Leviathan et al., 2023).
"""

import math
import numbers
import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import mlx.core as mx


class SettingsError(ValueError):
    """Sampling or drafting settings that cannot be honoured."""


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0  # 1.0: no top-p
    seed: Optional[int] = None

    def __post_init__(self):
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise SettingsError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise SettingsError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SettingsError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (not is_integer(self.seed) or not 0 <= self.seed < 2**64):
            raise SettingsError(f"seed must be an integer in [0, 2**64), got {self.seed}")
        object.__setattr__(self, "top_k", int(self.top_k))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    def unseeded(self) -> "SamplingSettings":
        """The same settings without the seed: what a compiled graph depends on (the seed only
        picks the uniforms, which are its inputs)."""
        return replace(self, seed=None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def named(cls, name: str, seed: Optional[int] = None) -> "SamplingSettings":
        """'greedy', or 'gemma': Gemma's default decoding settings (1.0 / 64 / 0.95)."""
        presets = {"greedy": (0.0, 0, 1.0), "gemma": (1.0, 64, 0.95)}
        if name not in presets:
            raise SettingsError(f"unknown sampling preset {name!r}; choose from {', '.join(presets)}")
        temperature, top_k, top_p = presets[name]
        return cls(temperature, top_k, top_p, seed)


def is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


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


def accept_by_match(
    target: Distribution, guesses: mx.array, uniforms: mx.array
) -> Tuple[mx.array, mx.array]:
    """Keep guesses while they equal the target's own draw.

    target: distributions at the g + 1 verified positions [..., g + 1, C].
    guesses: [..., g]. uniforms: one per position [..., g + 1].
    Returns (kept [...], tokens [..., g + 1]): the first kept + 1 tokens are the output.
    """
    tokens = target.sample(uniforms)
    return _leading_true(guesses == tokens[..., :-1]), tokens


def accept_by_ratio(
    target: Distribution,
    guesses: mx.array,
    draft_probs: mx.array,
    accept_uniforms: mx.array,
    residual_uniforms: mx.array,
    bonus_uniform: mx.array,
) -> Tuple[mx.array, mx.array]:
    """Keep sampled guesses with probability min(1, p/q); replace the first rejected one with
    a draw from the residual normalise(max(p - q, 0)).

    draft_probs: q over the whole vocabulary at each guess [..., g, V].
    accept_uniforms: [..., g]; residual_uniforms: [..., g, 2]; bonus_uniform: [..., 2].
    Returns (kept [...], tokens [..., g + 1]) as `accept_by_match` does.
    """
    g = guesses.shape[-1]
    vocab = draft_probs.shape[-1]
    p = target.dense(vocab)
    p_draft = p[..., :g, :]
    safe = mx.clip(guesses, 0, vocab - 1)  # a guess outside the vocabulary is never kept
    p_x = mx.take_along_axis(p_draft, safe[..., None], axis=-1)[..., 0]
    q_x = mx.take_along_axis(draft_probs, safe[..., None], axis=-1)[..., 0]
    # u < p/q, written without the division; q(x) > 0 because x was drawn from q.
    keep = (accept_uniforms * q_x < p_x) & (safe == guesses)
    residual = mx.maximum(p_draft - draft_probs, 0)
    # When rounding leaves q >= p everywhere the residual is empty; p itself is then the answer.
    empty = residual.sum(axis=-1, keepdims=True) <= 0
    corrections = inverse_cdf(mx.where(empty, p_draft, residual), residual_uniforms)
    last = Distribution(target.ids[..., g, :], target.probs[..., g, :], target.count[..., g])
    bonus = last.sample(bonus_uniform)
    kept = _leading_true(keep)
    # Position i holds the guess when kept, else the correction; the bonus follows g guesses.
    tokens = mx.concatenate([mx.where(keep, guesses, corrections), bonus[..., None]], axis=-1)
    return kept, tokens


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


def _leading_true(flags: mx.array) -> mx.array:
    """How many leading entries of the last axis are True."""
    if flags.shape[-1] == 0:
        return mx.zeros(flags.shape[:-1], dtype=mx.int32)
    return mx.cumprod(flags.astype(mx.int32), axis=-1).sum(axis=-1)


class UniformStream:
    """Pairs of uniforms in [0, 1) indexed by output position, drawn in blocks from one key.

    Indexing by position (not by draw order) is what makes the match rule give the same tokens
    with and without drafting for the same seed.
    """

    block = 1024

    def __init__(self, key: mx.array):
        self._key = key
        self._blocks = []

    def take(self, start: int, n: int, ahead: Optional[mx.array] = None, most: int = 0) -> mx.array:
        """Uniforms [n, 2] for output positions start .. start + n - 1. For a cycle built ahead
        of the host, the positions start `ahead` later: a device array (the tokens the running
        cycle settles, at most `most`), so the slice is taken on the device."""
        if n == 0:
            return mx.zeros((0, 2))
        end = start + most + n
        while end > len(self._blocks) * self.block:
            self._key, sub = mx.random.split(self._key)
            self._blocks.append(mx.random.uniform(shape=(self.block, 2), key=sub))
        first, last = start // self.block, (end - 1) // self.block
        joined = mx.concatenate(self._blocks[first : last + 1]) if last > first else self._blocks[first]
        offset = start - first * self.block
        if ahead is None:
            return joined[offset : offset + n]
        return mx.slice(joined, (ahead + offset).reshape(1), axes=(0,), slice_size=(n, 2))


STREAMS = ("target", "accept", "residual", "draft")


def uniform_streams(seed: Optional[int]) -> dict:
    """Independent uniform streams, one per use, from one seed (a fresh random one if None)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    keys = mx.random.split(mx.random.key(seed), len(STREAMS))
    return {name: UniformStream(keys[i]) for i, name in enumerate(STREAMS)}
