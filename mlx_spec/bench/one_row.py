"""The loop's own parts on one sequence, for timing them apart: its pass and its drafter steps
over the sequence's K/V as a row of the loop's storage (a generation alone is a batch of one),
and its steps, built whole.

    with as_row(target, state) as row:
        mx.eval(row.pass_(tokens))      # a pass over tokens [1, N], then cut back
        row.cut(N)
"""

from contextlib import contextmanager

import mlx.core as mx

from ..decoding.limits import MAX_DRAFT_TOKENS, TRIM_ALLOWANCE
from ..decoding.sequence import SequenceState
from ..drafting.pieces import run_through


class Row:
    def __init__(self, target, state: SequenceState, caches):
        self.target, self.state, self.caches = target, state, caches

    def pass_(self, tokens: mx.array):
        """(logits, hidden) of the loop's pass over `tokens` [1, N] after the row's positions."""
        return self.target.forward_batch(tokens, self.caches)

    def cut(self, n: int) -> None:
        self.caches.trim(0, n)

    def draft(self, drafter, g: int) -> mx.array:
        """g steps of the MTP drafter as the loop drafts a row: [1, g] guesses."""
        offsets = self.caches.device_offsets()
        kv = self.target.batch_drafter_buffers(self.caches, offsets)
        last = mx.array([[self.state.tokens[-1]]], mx.int32)
        guesses, _ = run_through(drafter.draft_batch_steps(last, self.state.hidden, offsets, kv, g))
        return guesses


@contextmanager
def as_row(target, state: SequenceState):
    """The sequence's caches as the one row of the loop's storage (given back at the end)."""
    caches = target.batch_caches(max_trim=TRIM_ALLOWANCE, max_pass=MAX_DRAFT_TOKENS + 1)
    state.enter(caches)
    try:
        yield Row(target, state, caches)
    finally:
        state.leave(caches)


@contextmanager
def one_row(target, state: SequenceState, settings, drafter, g: int, report: bool = True):
    """A batch of one row over `state` drafting g guesses a step (`drafter`), as a generation
    alone runs it: yields a function that builds its next step from the settled row (whole, not
    launched). Call `settled()` after each to cut the step's positions; the row leaves at the end."""
    from ..decoding.batch import Batch
    from ..decoding.decoder import Decoder

    batch = Batch(target)
    reader = batch.join(Decoder(target, settings, drafter, g if drafter is not None else None, report), state, 1 << 30)

    def build():
        return run_through(batch.builder.pieces(batch.rows, None))

    build.settled = batch.rows[0].state.trim_to_settled
    try:
        yield build
    finally:
        reader.close()
