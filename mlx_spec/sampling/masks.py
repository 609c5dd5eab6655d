"""A grammar's allowed tokens on the device: the packed bitmask a matcher fills on the host
(bit t % 32 of word t // 32 set when token t is allowed, as llguidance packs it) unpacked and
applied to the target's logits, inside the verification's compiled graph.

A constraint restricts the target's distribution to the allowed tokens and renormalises it: the
logits of every other token become -inf before temperature, top-k and top-p (distribution.py),
so greedy picks the allowed token of highest probability (ties to the lowest id) and sampling
draws from the restricted distribution.
"""

import mlx.core as mx

BITS = 32


def words_for(vocab_size: int) -> int:
    """The int32 words a bitmask over `vocab_size` tokens takes."""
    return (vocab_size + BITS - 1) // BITS


def allowed(bitmask: mx.array, vocab_size: int) -> mx.array:
    """bool [..., vocab_size] from a packed bitmask [..., words]."""
    shifts = mx.arange(BITS, dtype=mx.int32)
    # (>> on a negative word shifts in ones on the left; the & 1 reads only the bit asked for)
    bits = mx.right_shift(bitmask[..., None], shifts) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab_size] == 1


def restricted(logits: mx.array, bitmask: mx.array) -> mx.array:
    """`logits` [..., V] with every token the bitmask [..., words] does not allow at -inf."""
    return mx.where(allowed(bitmask, logits.shape[-1]), logits, -mx.inf)
