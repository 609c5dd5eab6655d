"""The loop's storage for a model of full-attention and Gated DeltaNet layers: `BatchCaches`
(models/batch_cache.py) over the attention layers, and for each Gated DeltaNet layer each row's
convolution window and recurrent state as its last pass began, that pass's inputs (`Stash`) and
where it began (recurrent.py says why).

A row's offset goes back as the K/V rows' do (trimmed on the host); the next pass replays its
last pass's positions up to the offset (on the device, from `began`: a step built ahead knows its
rows' offsets there only). A row can go back no further than where its last pass began, so what
a leaving reader did not take stays in its sequence past that (decoding/batch.py allows it);
the trims of a step's rejected guesses and padding never reach that far.
"""

from typing import List, Optional

import mlx.core as mx

from ..batch_cache import BatchCaches, BatchSlot
from .recurrent import RecurrentCache, Stash, of_cache, replay

RECURRENT = "recurrent"  # a layer kind beside attention's window (None: full attention)


class HybridCaches(BatchCaches):
    def __init__(self, kinds: list, layers: list, max_trim: int, max_pass: int, mtp_hidden: Optional[int] = None):
        """kinds[i]: target layer i's kind (RECURRENT, or its attention's sliding window, None for
        full attention); layers: the Gated DeltaNet modules, in order (their convolution and
        recurrence replay a row's positions when it leaves). mtp_hidden: the target's hidden
        size where the last kind is the MTP layer's K/V (models/qwen3_5/mtp.py: MTPCache), and each row keeps the hidden states its
        next pass's first pair may need."""
        super().__init__([k for k in kinds if k != RECURRENT], max_trim, max_pass)
        self.kinds, self.layers, self.mtp_hidden = kinds, layers, mtp_hidden
        self.mtp = mtp_hidden is not None
        # [B, n, H]: each row's target hidden states at began - 1, began, ... (the last pass's)
        self.before: Optional[mx.array] = None
        self.conv_windows: List[Optional[mx.array]] = [None] * len(layers)  # [B, K-1, C]
        self.states: List[Optional[mx.array]] = [None] * len(layers)  # [B, Hv, Dv, Dk], float32
        self.stashes: List[Optional[Stash]] = [None] * len(layers)  # the last pass's inputs
        self.began: Optional[mx.array] = None  # [B]: each row's offset when its last pass began
        # The host's count of it: at least the true one (a step built ahead counts its rows'
        # offsets at the most they can be), so the room it leaves is never more than there is.
        self.began_at_most: List[int] = []

    def add(self, cache: list) -> BatchSlot:
        """A sequence's caches (all layers, in order) as a new row."""
        attention = [c for c, kind in zip(cache, self.kinds) if kind != RECURRENT]
        recurrent = [c for c, kind in zip(cache, self.kinds) if kind == RECURRENT]
        slot = super().add(attention)
        offset = self.offsets[-1]
        for i, (layer, own) in enumerate(zip(self.layers, recurrent)):
            window, state = of_cache(own, layer, attention[0].keys.dtype)
            self.conv_windows[i] = _stacked(self.conv_windows[i], window)
            self.states[i] = _stacked(self.states[i], state)
            # Nothing of its own to replay: a stash as long as the other rows', kept to none.
            stash = self.stashes[i] or Stash(*(mx.zeros((0, 0, n), window.dtype)
                                               for n in (layer.conv_dim, layer.num_v_heads, layer.num_v_heads)))
            self.stashes[i] = Stash(*(mx.concatenate([part, mx.zeros((1, *part.shape[1:]), part.dtype)]) for part in stash))
        self.began = _stacked(self.began, mx.array([offset], mx.int32))
        self.began_at_most.append(offset)
        if self.mtp:  # its next pass begins at its offset: the hidden state before it first
            dtype = attention[0].keys.dtype
            own = cache[-1].hidden_before(offset, mx.zeros((1, 1, self.mtp_hidden), dtype)).astype(dtype)
            rows = self.before if self.before is not None else mx.zeros((0, 1, self.mtp_hidden), dtype)
            row = mx.concatenate([own, mx.zeros((1, rows.shape[1] - 1, self.mtp_hidden), dtype)], axis=1)
            self.before = mx.concatenate([rows, row])
        return slot

    def remove(self, slot: BatchSlot, fresh: list) -> list:
        """Take a row out: its K/V (BatchCaches.remove) and each Gated DeltaNet layer's window and
        state at its offset, replayed, as caches of its own in the target's layer order (`fresh`:
        a sequence's new caches, make_cache's)."""
        b, offset = slot.index, slot.offset
        own = []
        kept = mx.array([offset], mx.int32) - self.began[b : b + 1]
        for i, layer in enumerate(self.layers):
            stash = Stash(*(part[b : b + 1] for part in self.stashes[i]))
            window, state = replay(layer, self.conv_windows[i][b : b + 1], self.states[i][b : b + 1], stash, kept)
            cache = RecurrentCache()
            cache[0], cache[1], cache.offset = window, state, offset
            own.append(cache)
        attention = super().remove(slot, [c for c, kind in zip(fresh, self.kinds) if kind != RECURRENT])
        if self.mtp:  # the hidden state before its offset goes with its MTP layer's K/V
            at = (mx.array(offset, mx.int32) - self.began[b]).reshape(1)
            attention[-1].keep_passed(mx.take(self.before[b : b + 1], at, axis=1), offset - 1)
        attention = iter(attention)
        keep = mx.array([r for r in range(len(self.began_at_most)) if r != b])
        rows_left = len(self.began_at_most) > 1
        for i in range(len(self.layers)):
            self.conv_windows[i] = self.conv_windows[i][keep] if rows_left else None
            self.states[i] = self.states[i][keep] if rows_left else None
            self.stashes[i] = Stash(*(part[keep] for part in self.stashes[i])) if rows_left else None
        self.began = self.began[keep] if rows_left else None
        if self.mtp:
            self.before = self.before[keep] if rows_left else None
        del self.began_at_most[b]
        recurrent = iter(own)
        return [next(recurrent) if kind == RECURRENT else next(attention) for kind in self.kinds]

    def trim(self, row: int, n: int) -> int:
        """As the K/V rows (the next pass replays up to the new offset): bounded by the K/V's room
        alone, as the trims of a step's own positions need (see the module's docstring)."""
        n = min(n, self.offsets[row])
        if n > BatchCaches.trim_room(self, row):
            raise ValueError(f"cannot trim {n} positions of row {row} at offset {self.offsets[row]}")
        self.offsets[row] -= n
        return n

    def trim_room(self, row: int) -> int:
        """How far the row can go back: no further than where its last pass began."""
        return max(0, min(BatchCaches.trim_room(self, row), self.offsets[row] - self.began_at_most[row]))

    def passed(self, windows: list, states: list, stashes: list, began: mx.array, before: Optional[mx.array] = None) -> None:
        """A pass ran from `began` [B] (its rows' offsets, on the device), leaving each Gated
        DeltaNet layer's window and state as it began and its inputs, and the hidden states
        from began - 1 (with an MTP layer); called before `written`."""
        self.conv_windows, self.states, self.stashes, self.began = list(windows), list(states), list(stashes), began
        self.before = before
        self.began_at_most = list(self.offsets)

    @property
    def recurrent_buffers(self) -> list:
        """What a pass reads of the Gated DeltaNet layers, flat: windows, states, stashes."""
        return [*self.conv_windows, *self.states, *(part for stash in self.stashes for part in stash)]

    @property
    def nbytes(self) -> int:
        held = [*self.recurrent_buffers, self.before]
        return super().nbytes + sum(a.nbytes for a in held if a is not None)


def _stacked(rows: Optional[mx.array], row: mx.array) -> mx.array:
    return row if rows is None else mx.concatenate([rows, row])

