"""The acceptance rules, both exact:
- `accept_by_match`: the target draws its own token at every position from one uniform per
  output index; a guess is kept while it equals that draw. For a deterministic (argmax) guess x
  this accepts with probability p(x) and otherwise yields a draw from p without x, renormalised.
  In greedy mode the draw is the argmax. With the same seed, output equals the target alone's.
- `accept_by_ratio`: for guesses sampled from the drafter's q, keep x with probability
  min(1, p(x) / q(x)); at the first rejection draw from normalise(max(p - q, 0)); after all are
  kept the bonus token is the target's own draw (Leviathan et al., 2023).
"""

from typing import Tuple

import mlx.core as mx

from .distribution import Distribution, inverse_cdf


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



def _leading_true(flags: mx.array) -> mx.array:
    """How many leading entries of the last axis are True."""
    if flags.shape[-1] == 0:
        return mx.zeros(flags.shape[:-1], dtype=mx.int32)
    return mx.cumprod(flags.astype(mx.int32), axis=-1).sum(axis=-1)
