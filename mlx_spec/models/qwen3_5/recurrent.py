"""The Gated DeltaNet layers' state, which cannot drop its newest positions as K/V can.

A Gated DeltaNet layer carries two arrays from one position to the next: the last K - 1 inputs
of its causal convolution and the recurrent state [Hv, Dv, Dk] (float32). So:

- a sequence's own cache (`RecurrentCache`: prefill, and between turns) goes back only to a mark,
  its arrays as they stood (a reference: MLX never writes in place into a shared array);
- a row of the loop's storage (storage.py) keeps both as they stood when its last pass began,
  and that pass's inputs (`Stash`: the convolution's input, a and b, per position). The next
  pass begins by replaying the positions kept (`replay`: mlx-lm's masked recurrence, t < kept)
  and only then runs its own. Replayed, the state is bitwise the one the kept positions alone
  leave (tests/test_qwen_rows.py). Keeping the inputs, not a state per position, keeps a row's
  memory at one state per layer: Qwen3.6-27B's is 3 MB per layer and row, in float32.

Every pass of the loop gives the recurrence a mask, even where it keeps every position: on Metal,
mlx-lm's kernel without a mask sums in another order than the masked one, and the replay needs
the mask.
"""

from typing import NamedTuple, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk


class RecurrentCache(ArraysCache):
    """A sequence's own cache of one Gated DeltaNet layer (mlx-lm's `ArraysCache`: [0] the
    convolution's window, [1] the recurrent state), with its position: the sequence state's
    cache interface, going back only where a mark was taken."""

    def __init__(self):
        super().__init__(2)
        self.offset = 0

    def advance(self, n: int) -> None:
        super().advance(n)
        self.offset += n

    def snapshot(self) -> tuple:
        return self.cache[0], self.cache[1], self.offset

    def restore(self, snapshot: tuple) -> None:
        self.cache[0], self.cache[1], self.offset = snapshot

    def lowest_reachable(self) -> int:
        """The lowest offset a snapshot taken now can be brought back to: its own."""
        return self.offset

    def trimmable_to(self, offset: int) -> bool:
        return offset == self.offset

    def is_trimmable(self) -> bool:
        return False

    def trim(self, n: int) -> int:
        if n > 0:
            raise ValueError(f"a Gated DeltaNet layer's state cannot drop its newest {n} positions (only a mark's can come back)")
        return 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.cache if a is not None)


class Stash(NamedTuple):
    """A pass's inputs to one Gated DeltaNet layer's convolution and recurrence, per position."""

    qkv: mx.array  # [B, L, conv_dim]: before the convolution
    a: mx.array  # [B, L, Hv]
    b: mx.array  # [B, L, Hv]


def convolve(layer: nn.Module, window: mx.array, qkv: mx.array) -> Tuple[mx.array, mx.array, mx.array, mx.array]:
    """(q, k, v, the convolution's input) of positions `qkv` [B, L, C] after `window` [B, K-1, C]."""
    conv_input = mx.concatenate([window, qkv], axis=1)
    out = nn.silu(layer.conv1d(conv_input))
    B, L = qkv.shape[:2]
    q, k, v = [t.reshape(B, L, h, d) for t, h, d in zip(
        mx.split(out, [layer.key_dim, 2 * layer.key_dim], -1),
        [layer.num_k_heads, layer.num_k_heads, layer.num_v_heads],
        [layer.head_k_dim, layer.head_k_dim, layer.head_v_dim])]
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim ** -0.5, eps=1e-6)
    return q, k, v, conv_input


def replay(layer: nn.Module, window: mx.array, state: mx.array, stash: Stash, kept: mx.array) -> Tuple[mx.array, mx.array]:
    """(window, state) after the first `kept` [B] positions of `stash`, from (window, state)
    before them (each row its own count, 0 included)."""
    L = stash.qkv.shape[1]
    if L == 0:
        return window, state
    mask = mx.arange(L)[None] < kept[:, None]
    q, k, v, conv_input = convolve(layer, window, mx.where(mask[..., None], stash.qkv, 0))
    _, state = gated_delta_update(q, k, v, stash.a, stash.b, layer.A_log, layer.dt_bias, state, mask)
    keep = layer.conv_kernel_size - 1
    window = mx.take_along_axis(conv_input, (kept[:, None] + mx.arange(keep)[None])[..., None], axis=1)
    return window, state


def run_layer(layer: nn.Module, x: mx.array, window: mx.array, state: mx.array) -> Tuple[mx.array, Stash]:
    """The layer's output for positions `x` [B, L, H] (normalised input) after (window, state),
    and their stash. The state after them is not kept: the next pass replays what was kept."""
    B, L, _ = x.shape
    qkv = layer.in_proj_qkv(x)
    z = layer.in_proj_z(x).reshape(B, L, layer.num_v_heads, layer.head_v_dim)
    b, a = layer.in_proj_b(x), layer.in_proj_a(x)
    q, k, v, _ = convolve(layer, window, qkv)
    out, _ = gated_delta_update(q, k, v, a, b, layer.A_log, layer.dt_bias, state, mx.ones((B, L), dtype=mx.bool_))
    out = layer.out_proj(layer.norm(out, z).reshape(B, L, -1))
    if getattr(layer, "sharding_group", None) is not None:  # split over a group: each rank's heads' share
        out = mx.distributed.all_sum(out, group=layer.sharding_group)
    return out, Stash(qkv, a, b)


def empty_state(layer: nn.Module, rows: int, dtype) -> Tuple[mx.array, mx.array]:
    """(window, state) before any position, as mlx-lm starts them."""
    window = mx.zeros((rows, layer.conv_kernel_size - 1, layer.conv_dim), dtype=dtype)
    state = mx.zeros((rows, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim), dtype=mx.float32)
    return window, state


def of_cache(cache: Optional[RecurrentCache], layer: nn.Module, dtype) -> Tuple[mx.array, mx.array]:
    """A sequence's (window, state), as empty_state where it has none yet."""
    if cache is None or cache[0] is None:
        return empty_state(layer, 1, dtype)
    return cache[0], cache[1]
