"""The K/V of the sequences decoding together (a batch, decoding/batch.py): one buffer per layer,
[B, H, C, D], row b holding sequence b at its own offset.

A sequence's prompt goes through its own caches (models/cache.py); when it joins the batch its
K/V are copied into a new row (`add`), and when it leaves they are copied back out into caches
of its own (`remove`), which its sequence state, the prompt cache and the next turn take on. In
between the batch's pass writes every row at once: one scatter per layer, each row at its own
offset.

- Full-attention layers: slot = position, the buffer grown for every row by whole steps.
- Sliding-window layers: a ring of `ring` slots, slot = position mod ring. It never moves or
  grows. A row's offset may go back (its rejected guesses and padding are trimmed), and the
  slots past it keep stale entries until the next pass overwrites them; the mask computes the
  position each slot holds as the newest one not past the queries, so a stale slot reads as a
  position `ring` earlier, outside every window. The ring is sized for that: the window, the
  drafter's extra position, twice the trim allowance and one pass's positions.
Rejected K/V are never zeroed, only left out by the mask (a zero key would still add e^0 to
every softmax denominator: mlx-vlm #1962).
"""

from typing import List, Optional

import mlx.core as mx

from .cache import FullCache, SlidingWindowCache



class BatchSlot:
    """A row of the batch as its sequence state sees its caches while it is in the batch: the
    offset (every layer's) and `trim`. Its index moves when rows before it leave."""

    def __init__(self, caches: "BatchCaches", index: int):
        self.caches, self.index = caches, index

    @property
    def offset(self) -> int:
        return self.caches.offsets[self.index]

    def trim(self, n: int) -> int:
        return self.caches.trim(self.index, n)

    @property
    def trim_room(self) -> int:
        return self.caches.trim_room(self.index)

    def is_trimmable(self) -> bool:
        return True


class BatchCaches:
    def __init__(self, windows: List[Optional[int]], max_trim: int, max_pass: int):
        """windows[i]: layer i's sliding window, None for full attention. `max_trim`: how far a
        row may go back below the furthest position it wrote (a step's padding and rejected
        guesses, and the tokens a leaving reader did not take); `max_pass`: the most positions
        a pass writes. The rings hold a window, the drafter's extra position and both."""
        self.windows, self.max_trim, self.max_pass = windows, max_trim, max_pass
        self.rings = [None if w is None else w + 1 + 2 * max_trim + max_pass for w in windows]
        self.keys: List[Optional[mx.array]] = [None] * len(windows)
        self.values: List[Optional[mx.array]] = [None] * len(windows)
        self.offsets: List[int] = []
        self.furthest: List[int] = []  # per row: the highest offset reached since it joined
        self.oldest: List[int] = []  # per row: the oldest position its rings were given at the join
        self.slots: List[BatchSlot] = []

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def capacity(self) -> int:
        """Slots of the full-attention buffers (0 before any row)."""
        full = [k for k, ring in zip(self.keys, self.rings) if ring is None and k is not None]
        return full[0].shape[2] if full else 0

    def add(self, cache: list) -> BatchSlot:
        """Copy a sequence's caches (models/cache.py, all layers at one offset) into a new row."""
        offset = cache[0].offset
        if offset == 0 or any(c.keys is None for c in cache):
            raise ValueError("a sequence joins the batch once its caches hold a position")
        self._grow(offset)
        for i, c in enumerate(cache):
            row_k, row_v = self._row_of(i, c, offset)
            self.keys[i] = row_k if self.keys[i] is None else mx.concatenate([self.keys[i], row_k])
            self.values[i] = row_v if self.values[i] is None else mx.concatenate([self.values[i], row_v])
        slot = BatchSlot(self, len(self.slots))
        self.slots.append(slot)
        self.offsets.append(offset)
        self.furthest.append(offset)
        self.oldest.append(max([c.start for c in cache if isinstance(c, SlidingWindowCache)] + [0]))
        return slot

    def _row_of(self, i: int, c, offset: int):
        """Layer i of a sequence's caches as one row of this layer's buffer."""
        ring = self.rings[i]
        B, H, _, Dk = c.keys.shape
        if ring is None and not self.slots and c.keys.shape[2] % FullCache.step == 0:
            # The first row takes the sequence's own buffers as they are (its slots past the
            # offset are masked): a generation alone copies none of its K/V in or out.
            return c.keys, c.values
        if ring is None:
            size = self.capacity or FullCache.step * -(-offset // FullCache.step)
            k = mx.zeros((1, H, size, Dk), c.keys.dtype)
            v = mx.zeros((1, H, size, c.values.shape[3]), c.values.dtype)
            k[..., :offset, :] = c.keys[..., :offset, :]
            v[..., :offset, :] = c.values[..., :offset, :]
            return k, v
        first = max(c.start, offset - ring)  # the positions the ring can hold, newest last
        slots = (mx.arange(first, offset) % ring)[None, None, :, None]
        lo = first - c.start
        k = mx.zeros((1, H, ring, Dk), c.keys.dtype)
        v = mx.zeros((1, H, ring, c.values.shape[3]), c.values.dtype)
        k = mx.put_along_axis(k, slots, c.keys[..., lo : offset - c.start, :], axis=2)
        v = mx.put_along_axis(v, slots, c.values[..., lo : offset - c.start, :], axis=2)
        return k, v

    def remove(self, slot: BatchSlot, fresh: list) -> list:
        """Take a row out: its K/V up to its offset, as caches of its own (`fresh`: a sequence's
        new caches, one per layer as the target makes them: its sliding ones are filled)."""
        b, offset = slot.index, slot.offset
        out = []
        for i, ring in enumerate(self.rings):
            k, v = self.keys[i][b : b + 1], self.values[i][b : b + 1]
            if ring is None:  # (the family's own kind of full cache where it makes one)
                c = fresh[i] if isinstance(fresh[i], FullCache) else FullCache()
                size = FullCache.step * -(-offset // FullCache.step)
                if len(self.slots) == 1 and k.shape[2] <= size + FullCache.step:
                    c.keys, c.values = self.keys[i], self.values[i]  # the last row takes the buffers as they are
                else:  # copies, as wide as its own K/V (not the widest row's the batch had): the buffer is dropped
                    c.keys, c.values = k[..., :size, :] * 1, v[..., :size, :] * 1
                c.offset = offset
            else:
                c = fresh[i]
                # The positions still in the ring: none older than it was given, none a newer
                # write (up to the furthest) has overwritten.
                held = min(offset - self.oldest[b], ring - 1 - (self.furthest[b] - offset), offset)
                slots = (mx.arange(offset - held, offset) % ring)[None, None, :, None]
                c.keys = mx.take_along_axis(k, slots, axis=2)
                c.values = mx.take_along_axis(v, slots, axis=2)
                # It may go back no further than what it holds leaves a window before (a
                # furthest position past the offset bounds its trims: models/cache.py), unless
                # it holds the whole sequence, from its first position.
                c.start, c.offset = offset - held, offset
                c.furthest = offset if c.start == 0 else max(offset, c.start + c.draft_span + c.max_trim)
            out.append(c)
        keep = [r for r in range(len(self.slots)) if r != b]
        # The rows left keep the full-attention buffers only as wide as the longest of them needs
        # (a row that leaves may have been the widest: the batch's K/V would stay its width).
        width = FullCache.step * -(-(max([self.offsets[r] for r in keep], default=0) + self.max_pass) // FullCache.step)
        for i, ring in enumerate(self.rings):
            k, v = self.keys[i], self.values[i]
            if ring is None and keep and width < k.shape[2]:
                k, v = k[..., :width, :], v[..., :width, :]
            self.keys[i] = k[mx.array(keep)] if keep else None  # (a gather: a buffer of its own)
            self.values[i] = v[mx.array(keep)] if keep else None
        del self.slots[b], self.offsets[b], self.furthest[b], self.oldest[b]
        for r, s in enumerate(self.slots):
            s.index = r
        return out

    def trim_room(self, row: int) -> int:
        """How many of a row's newest positions `trim` can still drop: down to `max_trim` below
        the furthest it wrote."""
        return max(0, min(self.offsets[row], self.offsets[row] - (self.furthest[row] - self.max_trim)))

    def trim(self, row: int, n: int) -> int:
        n = min(n, self.offsets[row])
        if n > self.trim_room(row):
            raise ValueError(f"cannot trim {n} positions of row {row} at offset {self.offsets[row]}: at most "
                             f"{self.max_trim} below the furthest written ({self.furthest[row]})")
        self.offsets[row] -= n
        return n

    def reserve(self, n: int) -> None:
        """Room for `n` more positions in every row (the full-attention buffers grow)."""
        self._grow(max(self.offsets, default=0) + n)

    def _grow(self, need: int) -> None:
        size = self.capacity
        if not size or need <= size:
            return
        grown = FullCache.step * -(-need // FullCache.step)
        for i, ring in enumerate(self.rings):
            if ring is None:
                pad = [(0, 0), (0, 0), (0, grown - size), (0, 0)]
                self.keys[i], self.values[i] = mx.pad(self.keys[i], pad), mx.pad(self.values[i], pad)

    def written(self, keys: List[mx.array], values: List[mx.array], n: int) -> None:
        """Take the buffers a pass returned, with `n` more positions written in every row."""
        self.keys, self.values = list(keys), list(values)
        self.offsets = [o + n for o in self.offsets]
        self.furthest = [max(f, o) for f, o in zip(self.furthest, self.offsets)]

    def device_offsets(self) -> mx.array:
        return mx.array(self.offsets, mx.int32)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values) if k is not None)


def held_positions(ring: int, end: mx.array) -> mx.array:
    """[B, ring]: the position each ring slot holds for rows whose newest position is end - 1
    (the newest position not past it that maps to the slot; negative: nothing yet)."""
    slots = mx.arange(ring)[None]
    return slots + ring * mx.floor_divide(end[:, None] - 1 - slots, ring)


def sliding_windows(cache: list) -> List[Optional[int]]:
    """Each layer's sliding window in a sequence's caches, None for full attention."""
    return [c.window if isinstance(c, SlidingWindowCache) else None for c in cache]
