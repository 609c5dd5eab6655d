"""The target's pass over a batch's rows (tokens [B, L]) as one compiled function, for any
mlx-lm model whose layers use mlx-lm's cache interface, over a `BatchCaches` (batch_cache.py).

As for one sequence (compiled_pass.py), the pass reads and writes the whole buffers, so that it is
traced again only when their shapes change (a row joins or leaves, the full-attention buffers
grow): each row's keys and values are scattered into its row at its offset (ring slots on the
sliding layers), and attention reads every slot through a mask of what each row's queries may
see: written, not in their future, within their window. RoPE takes each row's own offset.
"""

from typing import List, Optional, Tuple

import mlx.core as mx

from .batch_cache import BatchCaches, held_positions
from .traces import TraceCache, shapes_of


class _RowsCache:
    """One layer's buffer [B, H, C, D] as the traced pass sees it (mlx-lm's cache interface)."""

    def __init__(self, keys: mx.array, values: mx.array, offsets: mx.array, ring: Optional[int]):
        self.keys, self.values = keys, values
        self.offset = offsets  # [B]: each row's first new position
        self.ring = ring  # None: slot = position; else slot = position mod ring

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        positions = self.offset[:, None] + mx.arange(keys.shape[2])[None]
        slots = (positions % self.ring if self.ring else positions)[:, None, :, None]
        self.keys = mx.put_along_axis(self.keys, slots, keys, axis=2)
        self.values = mx.put_along_axis(self.values, slots, values, axis=2)
        return self.keys, self.values

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        queries = (self.offset[:, None] + mx.arange(N)[None])[:, :, None]  # [B, N, 1]
        if self.ring:
            held = held_positions(self.ring, self.offset + N)[:, None, :]  # [B, 1, C]
        else:
            held = mx.arange(self.keys.shape[2])[None, None]
        visible = (held <= queries) & (held >= 0)
        if window_size is not None:
            visible = visible & (held > queries - window_size)
        return visible[:, None]  # [B, 1, N, C]


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
        rings = tuple(caches.rings)
        function = self.traces.get(("batch-pass", rings, shapes_of([tokens, *buffers])), lambda: self._pass(rings))
        logits, hidden, *written = function(tokens.astype(mx.int32), caches.device_offsets() if offsets is None else offsets, *buffers)
        caches.written(written[0::2], written[1::2], n)
        return logits, hidden

    def _pass(self, rings: tuple):
        def run(tokens, offsets, *buffers):
            layers: List[_RowsCache] = [_RowsCache(buffers[2 * i], buffers[2 * i + 1], offsets, ring)
                                        for i, ring in enumerate(rings)]
            hidden = self.target.hidden(tokens, layers)
            return [self.target.logits(hidden), hidden, *[b for c in layers for b in (c.keys, c.values)]]

        return run
