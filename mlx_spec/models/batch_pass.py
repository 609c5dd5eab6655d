"""The target's pass over a batch's rows (tokens [B, L]) as one compiled function, for any
mlx-lm model whose layers use mlx-lm's cache interface, over a `BatchCaches` (batch_cache.py).

Built op by op in Python, a pass of Gemma 4 E2B is some six thousand primitives: on a fast Mac
their host build takes about as long as the device takes to run them, and on a small model each
primitive's launch costs more than its work. Compiled, the host replays a recorded graph and the
element-wise chains fuse. A compiled function is traced again whenever an input changes shape,
so the pass reads and writes the whole buffers, whose shapes change only when a row joins or
leaves or the full-attention buffers grow (every 512 positions): each row's keys and values are
scattered into its row at its offset (an input array, not a Python int baked into the trace;
ring slots on the sliding layers), and attention reads the slots through a mask of what each
row's queries may see: written, not in their future, within their window. RoPE takes each row's
own offset. The mask gives every query exactly the keys the plain pass gives it (the tests
check it). Prefill (long, variable lengths) stays plain.
"""

from typing import List, Optional, Tuple

import mlx.core as mx

from .batch_cache import BatchCaches
from .traces import TraceCache, shapes_of

MAX_POSITIONS = 32  # the most positions a pass takes (a draft and the token before it)


class RowsCache:
    """One layer's buffer [B, H, C, D] as the traced pass sees it (mlx-lm's cache interface).

    A sliding layer's attention reads only the positions its queries may see, gathered from the
    ring in position order (window + queries - 1 slots, not the whole ring: the ring is sized for
    trims and passes, several times a small window)."""

    def __init__(self, keys: mx.array, values: mx.array, offsets: mx.array, ring: Optional[int], window: Optional[int]):
        self.keys, self.values = keys, values
        self.offset = offsets  # [B]: each row's first new position
        self.ring = ring  # None: slot = position; else slot = position mod ring
        self.window = window

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        positions = self.offset[:, None] + mx.arange(keys.shape[2])[None]
        slots = (positions % self.ring if self.ring else positions)[:, None, :, None]
        self.keys = mx.put_along_axis(self.keys, slots, keys, axis=2)
        self.values = mx.put_along_axis(self.values, slots, values, axis=2)
        if not self.ring:
            return self.keys, self.values
        read = (mx.maximum(self._read(keys.shape[2]), 0) % self.ring)[:, None, :, None]
        return mx.take_along_axis(self.keys, read, axis=2), mx.take_along_axis(self.values, read, axis=2)

    def _read(self, n: int) -> mx.array:
        """[B, window + n - 1]: the positions a sliding layer's n queries may see (negative:
        before the sequence, masked)."""
        return self.offset[:, None] - self.window + 1 + mx.arange(self.window + n - 1)[None]

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        queries = (self.offset[:, None] + mx.arange(N)[None])[:, :, None]  # [B, N, 1]
        if self.ring:
            held = self._read(N)[:, None, :]  # [B, 1, window + N - 1]
        else:
            held = mx.arange(self.keys.shape[2])[None, None]
        visible = (held <= queries) & (held >= 0)
        if window_size is not None:
            visible = visible & (held > queries - window_size)
        return visible[:, None]  # [B, 1, N, C]


def check_rows(tokens: mx.array, caches) -> None:
    """A ValueError where a batch pass's tokens [B, L] do not fit its storage: a row per sequence
    and at most MAX_POSITIONS positions (every family's pass checks this first)."""
    if tokens.shape[0] != len(caches) or tokens.shape[1] > MAX_POSITIONS:
        raise ValueError(f"a batch pass takes one row per sequence and at most {MAX_POSITIONS} positions, "
                         f"got {tokens.shape} for {len(caches)} rows")


class BatchPass:
    """`target(tokens, rows)` for a batch, compiled. The target gives `hidden(tokens, cache)`,
    `logits(hidden)` and its weights as `model`."""

    def __init__(self, target, traces: TraceCache):
        self.target, self.traces = target, traces
        self._weights_ready = False

    def __call__(self, tokens: mx.array, caches: BatchCaches, offsets: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) [B, L, ...] of every row's tokens, each row at its own offset; every
        row's offset advances by L. `offsets`: the rows' offsets on the device, for a step built
        ahead (the caches' own then count the most each can be)."""
        n = tokens.shape[1]
        caches.reserve(n)
        buffers = [b for k, v in zip(caches.keys, caches.values) for b in (k, v)]
        if not self._weights_ready:
            mx.eval(self.target.model.parameters())  # constants of the trace: evaluated first
            self._weights_ready = True
        rings, windows = tuple(caches.rings), tuple(caches.windows)
        function = self.traces.get(("batch-pass", rings, windows, shapes_of([tokens, *buffers])), lambda: self._pass(rings, windows))
        logits, hidden, *written = function(tokens.astype(mx.int32), caches.device_offsets() if offsets is None else offsets, *buffers)
        caches.written(written[0::2], written[1::2], n)
        return logits, hidden

    def _pass(self, rings: tuple, windows: tuple):
        def run(tokens, offsets, *buffers):
            layers: List[RowsCache] = [RowsCache(buffers[2 * i], buffers[2 * i + 1], offsets, ring, window)
                                        for i, (ring, window) in enumerate(zip(rings, windows))]
            hidden = self.target.hidden(tokens, layers)
            return [self.target.logits(hidden), hidden, *[b for c in layers for b in (c.keys, c.values)]]

        return run
