"""A target's decoding pass (a few positions at a time) as one compiled function, for any
mlx-lm model whose layers use mlx-lm's cache interface (`update_and_fetch`, `make_mask`) over
the caches of models/cache.py: Gemma 4's target, or another family's.

Built op by op in Python, a pass of Gemma 4 E2B is some six thousand primitives: on a fast Mac
their host build takes about as long as the device takes to run them, and on a small model each
primitive's launch costs more than its work. Compiled, the host replays a recorded graph and the
element-wise chains fuse.

A compiled function is traced again whenever an input changes shape, so the pass reads and
writes the caches' whole buffers, whose shapes change only when a cache grows them:
- each layer's new keys and values are written into its buffer at the offset, which is an input
  array (not a Python int baked into the trace);
- attention reads the whole buffer through a mask of the slots each query may see: written,
  not in its future, and (sliding layers) within its window.
The mask gives every query exactly the keys the plain pass gives it (the tests check it).
Prefill (long, variable lengths) stays plain.
"""

from typing import List, Optional, Tuple

import mlx.core as mx

from .cache import FullCache, SlidingWindowCache
from .traces import TraceCache, shapes_of

MAX_POSITIONS = 32  # longer inputs (prefill chunks) take the plain pass


class _BufferCache:
    """One layer's cache as the traced pass sees it: its whole buffers and two position arrays.
    It answers the part of mlx-lm's cache interface that mlx-lm's attention layers use."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array, start: mx.array):
        self.keys, self.values = keys, values
        self.offset = offset  # position of the first new query
        self.start = start  # position held in buffer slot 0

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        slot = (self.offset - self.start).reshape(1)
        self.keys = mx.slice_update(self.keys, keys, slot, axes=(2,))
        self.values = mx.slice_update(self.values, values, slot, axes=(2,))
        return self.keys, self.values

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        queries = self.offset + mx.arange(N)[:, None]
        held = self.start + mx.arange(self.keys.shape[2])[None]
        visible = held <= queries  # slots past the newest query hold nothing yet, or stale guesses
        if window_size is not None:
            visible = visible & (held > queries - window_size)
        return visible


class CompiledPass:
    """`target(tokens, cache)` for short inputs, compiled; caches must be ours and not empty.
    The target gives `hidden(tokens, cache)`, `logits(hidden)` and its weights as `model`."""

    def __init__(self, target, traces: TraceCache):
        self.target = target
        self.traces = traces  # the target's: a trace per input shape (pass length and buffer sizes)
        self._weights_ready = False

    @staticmethod
    def applies(tokens: mx.array, cache: list) -> bool:
        """Whether the compiled pass can run on these caches. mlx-lm's model builds one mask per
        attention type, from the first layer of that type, and every layer of the type uses it:
        here a mask is in buffer slots, so those layers' buffers must start at the same position
        and have the same size (they do: they are written alike)."""
        if tokens.shape[0] != 1 or tokens.shape[1] > MAX_POSITIONS:
            return False
        if not all(isinstance(c, (FullCache, SlidingWindowCache)) and c.keys is not None for c in cache):
            return False
        layouts = {}
        for c in cache:
            layouts.setdefault(type(c), set()).add((c.start, c.keys.shape[2]))
        return all(len(layout) == 1 for layout in layouts.values())

    def __call__(self, tokens: mx.array, cache: list, offset: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """The pass at the caches' offset, or at `offset` (a device array no greater than theirs,
        for a pass built before the host knows where the sequence ends). Either way the caches'
        offsets advance by the tokens' length, and reserve room from there."""
        n = tokens.shape[1]
        for c in cache:
            c.reserve(n)
        buffers = [b for c in cache for b in (c.keys, c.values)]
        at = mx.array(cache[0].offset, mx.int32) if offset is None else offset.astype(mx.int32)
        logits, hidden, *written = self._function(tokens, buffers)(
            tokens.astype(mx.int32), at,
            mx.array([c.start for c in cache], mx.int32), *buffers)
        for i, c in enumerate(cache):
            c.written(written[2 * i], written[2 * i + 1], n)
        return logits, hidden

    def _function(self, tokens: mx.array, buffers: List[mx.array]):
        """The compiled pass for these input shapes (see traces.py)."""
        if not self._weights_ready:
            # The weights enter the trace as constants: evaluated, or the trace would compute them.
            mx.eval(self.target.model.parameters())
            self._weights_ready = True
        return self.traces.get(("pass", shapes_of([tokens, *buffers])), lambda: self._pass)

    def _pass(self, tokens, offset, starts, *buffers):
        caches = [_BufferCache(buffers[2 * i], buffers[2 * i + 1], offset, starts[i]) for i in range(len(buffers) // 2)]
        hidden = self.target.hidden(tokens, caches)
        written = [b for c in caches for b in (c.keys, c.values)]
        return [self.target.logits(hidden), hidden, *written]
