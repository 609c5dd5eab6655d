"""A sliding-window K/V cache whose newest entries can be dropped at any offset.

mlx-lm's ``RotatingKVCache`` stops being trimmable once it wraps (offset >= window), which is
exactly when speculative decoding needs it most. This cache keeps its entries in temporal order
in a buffer that holds the window plus a slack of ``max_trim`` positions, so the last
``max_trim`` positions can always be dropped and every query still sees its full window. When the
buffer fills up, the entries still needed are moved to its front (one copy every ``step``
tokens), so memory stays bounded however long the generation runs.

It implements the part of mlx-lm's cache interface that mlx-lm's Gemma 4 attention uses:
``offset``, ``update_and_fetch`` and ``make_mask``, plus ``trim``. ``FullCache`` is mlx-lm's
full-attention cache, its buffer grown by whole steps. These are a sequence's own caches (its
prompt goes through them); while it decodes, its K/V are a row of the loop's storage
(batch_cache.py).
"""

from typing import Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class SlidingWindowCache:
    step = 256

    def __init__(self, window: int, max_trim: int):
        if window < 1 or max_trim < 0:
            raise ValueError(f"window must be >= 1 and max_trim >= 0, got {window}, {max_trim}")
        self.window = window
        self.max_trim = max_trim
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None
        # The MTP drafter reads the last window + 1 positions: transformers' assistant masks its
        # sliding layers with |query - key| <= window.
        self.draft_span = window + 1
        self.offset = 0  # positions written so far (the next position to write)
        self.start = 0  # absolute position held in buffer slot 0
        self.furthest = 0  # the highest offset ever reached; trims may go max_trim below it

    def _oldest_needed(self) -> int:
        # After a trim of up to max_trim, the next query (and the drafter, which reads the
        # last `draft_span` settled positions) must still find everything it reads.
        return max(self.start, self.offset - self.max_trim - self.draft_span)

    def _make_room(self, n_new: int, like_k: mx.array, like_v: mx.array) -> None:
        keep_from = self._oldest_needed()
        kept = self.offset - keep_from
        need = kept + n_new
        # Room for `step` more positions before the next move: one copy every `step` tokens.
        size = max(self.draft_span + self.max_trim + self.step, need)
        B, H, _, Dk = like_k.shape
        new_k = mx.zeros((B, H, size, Dk), like_k.dtype)
        new_v = mx.zeros((B, H, size, like_v.shape[3]), like_v.dtype)
        if self.keys is not None and kept > 0:
            lo = keep_from - self.start
            new_k[..., :kept, :] = self.keys[..., lo : lo + kept, :]
            new_v[..., :kept, :] = self.values[..., lo : lo + kept, :]
        self.keys, self.values, self.start = new_k, new_v, keep_from

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Append `L` positions; return the keys and values the new queries can see."""
        n_new = keys.shape[2]
        if self.keys is None or self.offset - self.start + n_new > self.keys.shape[2]:
            self._make_room(n_new, keys, values)
        i = self.offset - self.start
        self.keys[..., i : i + n_new, :] = keys
        self.values[..., i : i + n_new, :] = values
        first = self._first_visible(self.offset) - self.start
        self.offset += n_new
        self.furthest = max(self.furthest, self.offset)
        end = self.offset - self.start
        return self.keys[..., first:end, :], self.values[..., first:end, :]

    def _first_visible(self, query_start: int) -> int:
        """Oldest position the first of the new queries (at `query_start`) can see."""
        return max(0, query_start - self.window + 1)

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        """Mask for `N` new queries against what `update_and_fetch` will return.

        The keys run from the first query's window start to the last new position; a query
        sees a key when the key is not in its future and lies within its own window.
        """
        window = self.window if window_size is None else window_size
        if window != self.window:
            raise ValueError(f"cache window {self.window} != requested window {window}")
        first = self._first_visible(self.offset)
        last_query = self.offset + N - 1
        if N == 1 and not return_array:
            return None
        if last_query - first < window and not return_array:
            return "causal"
        q = mx.arange(self.offset, self.offset + N)[:, None]
        k = mx.arange(first, last_query + 1)[None]
        return (k <= q) & (k > q - window)

    def draft_range(self) -> tuple:
        """Buffer slots [lo, hi) of the last `draft_span` written positions, oldest first: what
        the MTP drafter's sliding layers attend to (bidirectionally)."""
        return max(self.start, self.offset - self.draft_span) - self.start, self.offset - self.start

    def snapshot(self) -> tuple:
        """The cache as it stands, for `restore`. The buffers are referenced, not copied: the
        next write copies them once (MLX writes in place only into a buffer nobody else holds)."""
        return (self.keys[...] if self.keys is not None else None,
                self.values[...] if self.values is not None else None,
                self.offset, self.start, self.furthest)

    def restore(self, snapshot: tuple) -> None:
        """Go back to a `snapshot`: the window as it stood then, trimmable by `max_trim` again."""
        keys, values, self.offset, self.start, self.furthest = snapshot
        # Fresh views, so that writes after this never reach the snapshot (it may be restored again).
        self.keys = keys[...] if keys is not None else None
        self.values = values[...] if values is not None else None

    def lowest_reachable(self) -> int:
        """The lowest offset a snapshot taken now can be trimmed to once restored."""
        return self.furthest - self.max_trim

    def trimmable_to(self, offset: int) -> bool:
        """Whether `trim` can bring the cache back to `offset` positions."""
        return self.furthest - self.max_trim <= offset <= self.offset

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the newest `n` positions. The offset may go back to `max_trim` positions below
        the furthest one ever written, at any offset."""
        n = min(n, self.offset)
        if self.offset - n < self.furthest - self.max_trim:
            raise ValueError(
                f"cannot trim {n} positions at offset {self.offset}: at most {self.max_trim} "
                f"below the furthest position written ({self.furthest})"
            )
        self.offset -= n
        return n

    def size(self) -> int:
        return min(self.offset, self.window)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class FullCache(KVCache):
    """mlx-lm's full-attention cache, its buffer grown by whole steps of `step` positions: the
    loop's pass is compiled for its storage's shapes (batch_pass.py), whose full-attention
    buffers are as wide as the sequences' own, so that every conversation sees the same few."""

    step = 512
    start = 0  # the position held in buffer slot 0 (always the first)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """mlx-lm's append (the plain pass, prefill), growing the buffer to a multiple of `step`
        (mlx-lm's own growth, from an offset that is not a multiple, would not)."""
        if self.keys is not None:
            self.reserve(keys.shape[2])
        return super().update_and_fetch(keys, values)

    def reserve(self, n: int) -> None:
        capacity = self.keys.shape[2]
        if self.offset + n <= capacity:
            return
        grown = -(-(self.offset + n) // self.step) * self.step
        B, H, _, Dk = self.keys.shape
        keys = mx.zeros((B, H, grown, Dk), self.keys.dtype)
        values = mx.zeros((B, H, grown, self.values.shape[3]), self.values.dtype)
        keys[..., : self.offset, :] = self.keys[..., : self.offset, :]
        values[..., : self.offset, :] = self.values[..., : self.offset, :]
        self.keys, self.values = keys, values


def trim_cache(cache: list, n: int) -> None:
    """Drop the newest `n` positions from every layer's cache."""
    if n <= 0:
        return
    for c in cache:
        c.trim(n)
