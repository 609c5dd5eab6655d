"""The loop: sequences decoding together, one target pass verifying every row's guesses. A
generation alone is a batch of one row (`Decoder.generate`); several requests at once (the
server, `generate_many`) are rows of one batch.

A row is one request's decoding: its decoder (sampling settings and seed, drafter, draft length
and acceptance, statistics), its sequence state and its budget. A row joins once its prompt is
in (`Batch.join`) and leaves at its end, between steps.

A step (`Batch.step`, built in batch_step.py):
- each row's draft length, from the engine's one cost model and the row's own acceptance
  (draft_lengths.py);
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

The steps are pipelined: the next step is built from the running one's lazy outputs and queued
before the running one syncs, so the device never waits while the host settles a step and its
readers take the tokens. MLX keeps only about ten tasks in flight (a Metal command buffer, or ten
CPU primitives) and queues the rest of a graph as they finish: `mx.async_eval` on a step of
thousands of primitives returns only once all but its last few hundred are queued, and the host
is free only while those run. So a step with guesses is launched in stages, a draft step at a
time, then whole, and after each stage the host builds a piece of the next step (a draft step)
while the device runs the rest of the stage (`launch.py`). A step built ahead that a row cannot
use (it finished, or left) is cut from that row's caches like rejected guesses.

A row's reports wait in its queue until its reader takes them, and a row whose reader has not
taken them sits the next step out (so no row runs more than two steps ahead of its reader). The
reader (`Batch.join` returns it) gives WAITING when it has nothing until the next step. A reader
closed early (its request ended, its client left) leaves the batch at once: the tokens it did not
take are taken back, and the caches hold exactly what it handed over.
"""

import time
from collections import deque
from typing import Deque, List, Optional, Tuple

import mlx.core as mx

from ..errors import SettingsError
from ..models.protocol import TargetModel
from .batch_step import Member, Step, StepBuilder
from .draft_lengths import DraftLengths
from .launch import Launcher
from .limits import MAX_DRAFT_TOKENS, TRIM_ALLOWANCE
from .lockstep import lost_peer
from .rows import Row, RowReader, outcome
from .step_clock import StepClock

RECENT_SECONDS = 10.0  # the window of the batch's tokens per second


class Batch:
    """The rows decoding together over one target."""

    def __init__(self, target: TargetModel, lengths: Optional[DraftLengths] = None, pipelined: bool = True):
        """`lengths`: the engine's cost model (a fresh one if None). `pipelined`: each step is
        built and queued while the one before it runs (False: built from the settled rows each
        time, for a comparison)."""
        self.target = target
        self.lengths = lengths if lengths is not None else DraftLengths()
        # Every row's K/V, one buffer per layer. A row goes back at most three passes'
        # positions, as a sequence alone does (limits.py): a step settled and not taken, the
        # next one settled, and one queued after it.
        self.caches = target.batch_caches(max_trim=TRIM_ALLOWANCE, max_pass=MAX_DRAFT_TOKENS + 1)
        self.builder = StepBuilder(target, self.caches, self.lengths)
        self.launcher = Launcher()
        self.pipelined = pipelined
        self.upcoming: Optional[Step] = None  # the step queued ahead, to run at the next call
        self.clock = StepClock(self.lengths)  # what each step costs, for the cost model
        self.rows: List[Row] = []
        self.steps = 0
        self.recent: Deque[Tuple[float, int]] = deque()  # (when, tokens) of the last steps

    def join(self, decoder, state, max_tokens: int) -> RowReader:
        """Add a sequence whose prompt is in (`decoder.start`), to generate up to `max_tokens`."""
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        row = Row(decoder, state, max_tokens, hidden=state.hidden, done=max_tokens == 0)
        if decoder.drafter is not None:
            decoder.drafter.begin(state)
        self.rows.append(row)
        return RowReader(self, row)

    def leave(self, row: Row) -> None:
        """The row leaves (once): its untaken tokens go back, its caches to its settled tokens
        (cut in the storage, within its trim allowance, then copied out)."""
        if row not in self.rows:
            return
        self.rows.remove(row)
        if row.ready:
            self._take_back_unread(row)
        row.state.trim_to_settled()
        if row.state.in_batch:
            row.state.leave(self.caches)
        if not self.rows:
            self._drop_upcoming()  # nothing of it is anyone's now
        row.decoder.stats.generation_seconds += time.perf_counter() - row.joined
        row.decoder.stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    @staticmethod
    def _take_back_unread(row: Row) -> None:
        """The tokens the reader did not take go back, as many as the caches can go back. A
        reader two steps behind may hold two steps' worth while the passes the row sat out wrote
        past them (every pass writes every row): past the trim allowance, the oldest stay in the
        sequence, settled and consistent with its caches, rather than fail the batch."""
        back = max(0, min(len(row.ready), row.state.takeable))
        keep = len(row.ready) - back
        row.decoder.take_back(row.state, back, row.ready[keep - 1][1] if keep else row.hidden)
        row.decoder.stats.generated_tokens -= back
        row.ready.clear()

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
        """One step for every row whose reader has taken its reports; the tokens it settled.

        The step queued at the last call (built ahead) is the one that runs now, if there is
        one: its stages are launched, the step after it built between them (a piece after each)
        and queued behind it, and only then does the running step sync, so that the device goes
        on while this one's rows settle and their readers take the tokens."""
        running, self.upcoming = self.upcoming, None
        try:
            if running is None:
                running = self.launcher.build(self.builder.pieces(self.rows, None))
                if running is None:
                    return 0
            work = self.builder.pieces(self.rows, running) if self.pipelined else None
            ahead = self.launcher.advance(running, work)
            self.launcher.sync(running, ahead)
        except BaseException as e:  # each row's reader raises it; the batch goes on without them
            self._fail(running, e)
            if not isinstance(e, Exception) or lost_peer(e):  # a lost rank: no later step can run
                raise
            return 0
        synced = time.perf_counter()
        settled = self._settle_step(running)
        self.clock.settled(running, ahead, synced)
        self.steps += 1
        self.recent.append((time.perf_counter(), sum(settled.values())))
        self.upcoming = ahead
        return sum(settled.values())

    def interrupt(self) -> None:
        """Other work (a prompt's chunk) runs before the next step: its time is not the step's."""
        self.clock.interrupt()

    def _drop_upcoming(self) -> None:
        """The step queued ahead is dropped unrun: a probe handed out for it is handed out again
        (its writes lie past the rows' settled positions, which every leave and settle cut)."""
        if self.upcoming is not None:
            for member in self.upcoming.stepping:
                member.row.decoder.policy.withdraw()
        self.upcoming = None

    def _fail(self, running: Optional[Step], error: BaseException) -> None:
        """A step failed: nothing queued settles, every row goes back to its settled tokens, and
        the rows it was for (all that were to step, if it was not built) end with the error."""
        failed = [m.row for m in running.stepping] if running is not None else [r for r in self.rows if not (r.done or r.ready)]
        for row in failed:
            row.error, row.done = error, True
        for row in self.rows:
            row.decoder.policy.withdraw()
            row.state.trim_to_settled()

    def _settle_step(self, step: Step) -> dict:
        """Settle each row of a synced step; {id(row): tokens settled} for the rows that stepped."""
        settled = {}
        for member in step.members:
            row = member.row
            if row not in self.rows:
                continue  # it left: its caches went back to its settled tokens
            if member.cycle is None or row.done:
                if row.state.in_batch:
                    row.state.trim(step.positions)  # nothing of this step is its
                continue
            tokens, hidden = len(row.state.tokens), row.state.hidden
            try:
                settled[id(row)] = self._settle(row, member, step.positions)
            except Exception as e:  # the row's own (its drafter's): it ends alone, the others go on
                row.decoder.take_back(row.state, len(row.state.tokens) - tokens, hidden)  # none handed over
                row.error, row.done = e, True
        return settled

    def _settle(self, row: Row, member: Member, positions: int) -> int:
        """Settle a row's cycle as it settles alone (`Decoder.settle`); the tokens it settled."""
        cycle = member.cycle
        if not member.alone:
            row.state.trim(positions - (cycle.g + 1))  # its padding
        out = outcome(cycle, row.budget, row.decoder.stop_tokens)
        row.decoder.stats.host_syncs += 1
        pending = row.decoder.settle(row.state, cycle, out)
        for i, report in enumerate(pending):
            row.ready.append((report, cycle.hidden[:, i : i + 1]))
        row.budget -= len(out.tokens)
        row.done = out.stopped or row.budget <= 0
        return len(out.tokens)
