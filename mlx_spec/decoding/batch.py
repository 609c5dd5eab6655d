"""Several sequences decoding together: one target pass verifies every row's guesses.

A row is one request's decoding: its decoder (sampling settings and seed, drafter, acceptance
statistics, statistics: what `Decoder` holds for a generation alone), its sequence state and its
budget. A row joins once its prompt is in (`Batch.join`) and leaves at its end, between steps.

A step (`Batch.step`):
- each row's draft length, from the batch's one cost model and the row's own acceptance
  (batch_policy.py);
- each row's draft from its own drafter, the MTP assistant's steps once for every row that uses
  it (drafting/rows.py);
- one target pass over B rows x L positions: each row's last settled token and its guesses,
  padded to the longest draft with copies of its last token, each row in its own caches at its
  own offset, in the storage of every row (models/batch_cache.py, models/batch_pass.py);
- each row's acceptance rule on its own logits, with its own uniforms, indexed by its own
  output positions;
- one host synchronisation; then each row cuts what it did not keep (its padding and its
  rejected guesses) from its own caches, sliding windows included, exactly as it would alone.
So a row gives the tokens it gives alone: the logits at each of its positions read only its own
caches, and its draws read only its own uniforms. Nothing rejected is ever attended: it lies
past the row's offset, where the mask leaves it out until the next pass overwrites it.

A row's reports wait in its queue until its reader takes them, and a row whose reader has not
taken them sits the next step out (so no row runs more than a step ahead of its reader). The
reader (`Batch.join` returns it) gives WAITING when it has nothing until the next step. A reader
closed early (its request ended, its client left) leaves the batch at once: the tokens it did not
take are taken back, and the caches hold exactly what it handed over.
"""

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional, Tuple

import mlx.core as mx

from ..drafting import DraftContext
from ..drafting.rows import draft_rows
from ..errors import SettingsError
from ..models.protocol import SharedKV, TargetModel
from .batch_policy import BatchDraftLength
from .cycle import Cycle, Start
from .decoder import Decoder
from .limits import ADAPTIVE_MAX_G, MAX_DRAFT_TOKENS
from .pipeline import outcome
from .reports import WAITING, TokenReport
from .sequence import SequenceState

RECENT_SECONDS = 10.0  # the window of the batch's tokens per second


@dataclass
class Row:
    decoder: Decoder
    state: SequenceState
    budget: int  # tokens still to generate
    # Settled reports not taken yet, each with the hidden state the sequence holds while its
    # token is the last (to take the rest back if the reader leaves).
    ready: Deque[Tuple[TokenReport, mx.array]] = field(default_factory=deque)
    hidden: Optional[mx.array] = None  # the state's hidden while the last token taken is its last
    done: bool = False
    error: Optional[BaseException] = None
    joined: float = field(default_factory=time.perf_counter)


class RowReader:
    """A row's reports as they settle, WAITING while the next step has not run; `close` leaves."""

    def __init__(self, batch: "Batch", row: Row):
        self.batch, self.row = batch, row

    def __iter__(self):
        return self

    def __next__(self):
        row = self.row
        if row.ready:
            report, row.hidden = row.ready.popleft()
            return report
        if row.error is not None:
            error, row.error = row.error, None
            self.close()
            raise error
        if row.done:
            self.close()
            raise StopIteration
        return WAITING

    def close(self) -> None:
        self.batch.leave(self.row)


class Batch:
    """The rows decoding together over one target."""

    def __init__(self, target: TargetModel, policy: Optional[BatchDraftLength] = None):
        self.target = target
        self.policy = policy if policy is not None else BatchDraftLength(ADAPTIVE_MAX_G)
        # Every row's K/V, one buffer per layer. A row goes back at most one step's positions:
        # its padding and rejected guesses, or the tokens its reader did not take.
        self.caches = target.batch_caches(max_trim=MAX_DRAFT_TOKENS + 1, max_pass=MAX_DRAFT_TOKENS + 1)
        self.rows: List[Row] = []
        self.steps = 0
        self.recent: Deque[Tuple[float, int]] = deque()  # (when, tokens) of the last steps

    def join(self, decoder: Decoder, state: SequenceState, max_tokens: int) -> RowReader:
        """Add a sequence whose prompt is in (`decoder.start`), to generate up to `max_tokens`."""
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        row = Row(decoder, state, max_tokens, hidden=state.hidden, done=max_tokens == 0)
        if decoder.drafter is not None:
            decoder.drafter.begin(state)
        self.rows.append(row)
        return RowReader(self, row)

    def leave(self, row: Row) -> None:
        """The row leaves (once): its untaken tokens go back, its caches to its settled tokens."""
        if row not in self.rows:
            return
        self.rows.remove(row)
        if row.state.in_batch:
            row.state.leave(self.caches)
        if row.ready:
            row.state.take_back(len(row.ready), row.hidden)
            row.decoder.stats.generated_tokens -= len(row.ready)
            row.ready.clear()
        row.state.trim_to_settled()
        row.decoder.stats.generation_seconds += time.perf_counter() - row.joined
        row.decoder.stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    @property
    def tokens_per_second(self) -> float:
        """The batch's tokens per second over the last RECENT_SECONDS."""
        now = time.perf_counter()
        while self.recent and self.recent[0][0] < now - RECENT_SECONDS:
            self.recent.popleft()
        if len(self.recent) < 2:
            return 0.0
        return sum(n for _, n in list(self.recent)[1:]) / max(now - self.recent[0][0], 1e-9)

    def step(self) -> int:
        """One step for every row whose reader has taken its reports; the tokens it settled."""
        rows = [r for r in self.rows if not r.done and not r.ready]
        if not rows:
            return 0
        began, traces = time.perf_counter(), self.target.traces.made
        try:
            cycles, positions = self._cycles(rows)
            mx.eval([a for c in cycles for a in c.arrays()])
        except BaseException as e:  # each row's reader raises it; the batch goes on without them
            for row in rows:
                row.state.trim_to_settled()
                row.error, row.done = e, True
            if not isinstance(e, Exception):
                raise
            return 0
        seconds = time.perf_counter() - began
        drafted = sum(c.g for c in cycles)
        settled = [self._settle(row, cycle, positions) for row, cycle in zip(rows, cycles)]
        kept = sum(n - 1 for n in settled)
        self.policy.observe(len(rows), positions, None if self.target.traces.made > traces else seconds, drafted, kept)
        self.steps += 1
        self.recent.append((time.perf_counter(), sum(settled)))
        return sum(settled)

    def _cycles(self, rows: List[Row]) -> Tuple[List[Cycle], int]:
        """The lazy graph of every row's cycle: drafts, one target pass, each row's acceptance.
        A row whose caches are still empty (a one-token prompt) runs its first cycle alone."""
        for row in rows:
            if not row.state.in_batch and row.state.cached > 0:
                row.state.enter(self.caches)
        alone = [r for r in rows if not r.state.in_batch]
        cycles = {id(r): r.decoder.builder.build(r.state, Start.settled(r.state), 0, None) for r in alone}
        together = [r for r in rows if r.state.in_batch]
        positions = 1
        if together:
            order = sorted(together, key=lambda r: r.state.cache[0].index)  # the storage's row order
            batched, positions = self._together(order)
            cycles.update(zip(map(id, order), batched))
        return [cycles[id(r)] for r in rows], positions

    def _together(self, rows: List[Row]) -> Tuple[List[Cycle], int]:
        """The cycles of every row in the storage (`rows` in its order, all of them)."""
        starts = [Start.settled(r.state) for r in rows]
        gs = [g if start.hidden is not None else 0 for g, start in zip(self.policy.choose(rows), starts)]
        contexts = [DraftContext(r.state.tokens, s.last, s.hidden, {}, r.decoder.settings,
                                 s.uniforms(r.decoder.uniforms["draft"], 0, g), ngrams=r.state.ngrams) if g else None
                    for r, s, g in zip(rows, starts, gs)]
        drafts = draft_rows([r.decoder.drafter for r in rows], contexts, gs, lambda idx: self._assistant_inputs(starts, idx))
        drafts = [r.decoder.builder.check(d, g) for r, d, g in zip(rows, drafts, gs)]
        positions = max(d.tokens.shape[0] for d in drafts) + 1
        vocab = self.target.vocab_size
        inputs = mx.concatenate([_padded(s.last, mx.clip(d.tokens, 0, vocab - 1), positions)
                                 for s, d in zip(starts, drafts)])
        logits, hidden = self.target.forward_batch(inputs, self.caches)
        cycles = []
        for b, (row, start, draft, asked) in enumerate(zip(rows, starts, drafts, gs)):
            g = draft.tokens.shape[0]
            kept, tokens, reports = row.decoder.builder.verify(start, logits[b, : g + 1], draft)
            cycles.append(Cycle(start, g, asked, draft.source, kept, tokens, hidden[b : b + 1, : g + 1], reports))
        return cycles, positions

    def _assistant_inputs(self, starts: List[Start], rows: List[int]) -> tuple:
        """The MTP assistant's inputs for these rows of the storage: last tokens, hidden states,
        positions (of the last settled token) and the K/V (of these rows only, if not all)."""
        kv = self.target.batch_drafter_buffers(self.caches)
        if len(rows) < len(starts):
            pick = mx.array(rows)
            kv = {k: SharedKV(v.keys[pick], v.values[pick], v.lo[pick], v.hi[pick], v.held if v.held.shape[0] == 1 else v.held[pick])
                  for k, v in kv.items()}
        last = mx.concatenate([starts[b].last for b in rows])
        hidden = mx.concatenate([starts[b].hidden for b in rows])
        positions = mx.array([starts[b].length - 1 for b in rows], mx.int32)
        return last, hidden, positions, kv

    def _settle(self, row: Row, cycle: Cycle, positions: int) -> int:
        """Settle a row's cycle as it settles alone (`Decoder.settle`); the tokens it settled."""
        if row.state.in_batch:
            row.state.trim(positions - (cycle.g + 1))  # its padding
        out = outcome(cycle, row.budget, row.decoder.stop_tokens)
        row.decoder.stats.host_syncs += 1
        pending = row.decoder.settle(row.state, cycle, out, timed=False)
        for i, report in enumerate(pending.reports):
            row.ready.append((report, cycle.hidden[:, i : i + 1]))
        row.budget -= len(out.tokens)
        row.done = out.stopped or row.budget <= 0
        return len(out.tokens)


def _padded(last: mx.array, guesses: mx.array, positions: int) -> mx.array:
    """[1, positions]: the last settled token, the guesses, then copies of the last token (their
    positions are computed and cut, as rejected guesses are)."""
    pad = positions - 1 - guesses.shape[0]
    parts = [last.astype(mx.int32), guesses.astype(mx.int32)[None]]
    if pad:
        parts.append(mx.broadcast_to(last.astype(mx.int32), (1, pad)))
    return mx.concatenate(parts, axis=1)
