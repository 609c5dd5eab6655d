"""One step of the loop (decoding/batch.py) as a lazy MLX graph: each row's draft, one target pass
over every row of the storage, each row's acceptance. Nothing here synchronises.

A step is built from the settled rows, or ahead: while the step before it still runs on the
device, from that step's lazy outputs. A row's start is then `Start.after` its running cycle:
its input token, hidden state, write offset and uniforms' index are device arrays, whatever the
running cycle keeps. So the device goes from one step to the next without waiting for the host,
and the host settles a step and hands its tokens over while the next one runs.

The build is host work in pieces (`StepBuilder.pieces`: a piece per draft step), and the step
keeps each draft step's outputs as a stage of its launch: the loop queues a step a stage at a
time and builds a piece of the next step after each (batch.py).

Every row of the storage is in every pass (the pass is over the whole buffers). A row that
does not step this time (its reader has not taken its reports, it has finished, or its budget
ends with the running step) sits it out: its last token goes through at its offset and the
positions are cut at the settle, as rejected guesses are. A sequence whose caches are still
empty (a one-token prompt) takes its first cycle alone, in its own caches, inside the step.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import mlx.core as mx

from ..drafting import DraftContext
from ..drafting.pieces import HostWork
from ..drafting.rows import draft_rows
from ..models.protocol import SharedKV
from .constrained_rows import forced_guesses, masks_of, walkable_draft
from .cycle import Cycle, Start
from .draft_lengths import Ask


@dataclass
class Member:
    row: object  # decoding/batch.py's Row
    cycle: Optional[Cycle]  # None: the row sits the step out
    alone: bool = False  # a first cycle in the sequence's own caches


@dataclass
class Step:
    """A step's graph, and what the loop has done with it: its stages launched (each draft
    step's outputs, then the whole step) and the host time spent on it (building, launching,
    waiting for its sync), which is what the draft lengths weigh."""

    members: List[Member]
    positions: int  # of the batch pass (0: no pass, only rows alone)
    rows: int  # of the batch pass
    traced: bool  # its build traced a compiled function: its time says nothing of such a step's cost
    ahead: bool  # built before the step it follows had synced
    stages: List[List[mx.array]] = field(default_factory=list)
    launched: int = 0  # launches so far: the stages, then the whole step
    seconds: float = 0.0
    stepping: List[Member] = field(init=False)

    def __post_init__(self):
        self.stepping = [m for m in self.members if m.cycle is not None]

    def arrays(self) -> list:
        return [a for m in self.stepping for a in m.cycle.arrays()]

    @property
    def shape(self) -> tuple:
        """(rows, positions) of its pass: what its time depends on."""
        return self.rows, self.positions

    def member(self, row) -> Optional[Member]:
        return next((m for m in self.members if m.row is row), None)

    @property
    def stages_left(self) -> bool:
        """Whether draft steps are still to be launched before the whole step."""
        return self.launched < len(self.stages)

    def next_stage(self) -> Optional[list]:
        """The arrays to launch next: a draft step's, then the whole step's; None after that."""
        if self.launched > len(self.stages):
            return None
        self.launched += 1
        return self.stages[self.launched - 1] if self.launched <= len(self.stages) else self.arrays()


class StepBuilder:
    def __init__(self, target, caches, lengths):
        self.target, self.caches, self.lengths = target, caches, lengths

    def pieces(self, rows: list, running: Optional[Step]) -> HostWork:
        """The next step for `rows` (the batch's rows), ahead of `running` if it is given, as
        host work in pieces. Returns None: nothing to step, or (ahead) a row's drafter needs the
        running step's tokens on the host."""
        # A row whose first cycle runs alone is left out until it has settled.
        rows = [r for r in rows if running is None or not (running.member(r) or Member(r, None)).alone]
        for row in rows:
            if not row.state.in_batch and row.state.cached > 0 and not row.done:
                row.state.enter(self.caches)
        before = self.target.traces.made
        alone = [Member(r, r.decoder.builder.build(r.state, Start.settled(r.state), 0, None), alone=True)
                 for r in rows if not r.state.in_batch and not r.done and not r.ready and r.budget > 0]
        stored = sorted((r for r in rows if r.state.in_batch), key=lambda r: r.state.cache[0].index)
        if len(stored) != len(self.caches):
            raise RuntimeError(f"the batch's storage holds {len(self.caches)} rows, its rows {len(stored)}")
        members, positions, stages = (yield from self._together(stored, running)) if stored else ([], 0, [])
        if members is None:
            for member in alone:  # built, not to run: its row's caches go back to its settled tokens
                member.row.state.trim_to_settled()
            return None
        step = Step(alone + members, positions, len(stored), self.target.traces.made > before, running is not None, stages)
        return step if step.stepping else None

    def _together(self, rows: list, running: Optional[Step]) -> HostWork:
        """(members, positions, stages) of the pass over every stored row, in the storage's order."""
        starts, drafters, asks = [], [], []
        for row in rows:
            member = running.member(row) if running is not None else None
            ran = member is not None and member.cycle is not None and not member.alone
            start = Start.after(row.state, member.cycle) if ran else Start.settled(row.state)
            budget = row.budget - (1 if ran else 0)  # the running cycle settles at least one token
            steps = not (row.done or row.ready or budget <= 0)
            drafter = row.decoder.drafter
            if ran and drafter is not None:
                drafter = drafter.for_ahead(member.cycle.source)
            starts.append(start)
            drafters.append(drafter if steps else None)
            # Nothing in the caches yet for a drafter to read (no hidden state): no guesses.
            drafts = row.decoder.drafter is not None and start.hidden is not None
            asks.append(Ask(row.decoder.policy if drafts else None, budget if steps else 0))
        if not any(a.budget > 0 for a in asks):
            return None, 0, []
        if running is not None and any(r.decoder.constraint is not None and a.budget > 0 for r, a in zip(rows, asks)):
            return None, 0, []  # a constraint's masks follow the settled tokens: the step waits for them
        gs = self.lengths.choose(asks)
        asked = forced_guesses(rows, asks, gs, drafters)
        # A first probe is built from the settled tokens (the row's first cycle ran alone), so
        # prompt lookup, which reads them, is among its drafters. (Handed out again after its
        # step was dropped unrun, it may be built ahead of them: then it drafts nothing.)
        free_only = [a.policy is not None and a.policy.free_only and g > 0 for a, g in zip(asks, gs)]
        if any(g > 0 and d is None for g, d, a in zip(gs, drafters, asks) if a.policy is not None):
            for ask in asks:  # the step waits for the tokens: what was handed out for it comes back
                if ask.policy is not None:
                    ask.policy.withdraw()
            return None, 0, []  # a drafter that reads the tokens on the host: the step waits for them
        offsets = _offsets(starts)
        contexts = [DraftContext(r.state.tokens, s.last, s.hidden, RowKV(lambda b=b: self._row_kv(offsets, b)), r.decoder.settings,
                                 s.uniforms(r.decoder.uniforms["draft"], 0, g), s.ahead, r.state.ngrams) if g else None
                    for b, (r, s, g) in enumerate(zip(rows, starts, gs))]
        drafts, stages = yield from draft_rows(drafters, contexts, gs, lambda idx: self._assistant_inputs(starts, offsets, idx),
                                               free_only)
        drafts = [r.decoder.builder.check(d, g) for r, d, g in zip(rows, drafts, gs)]
        positions = max(d.tokens.shape[0] for d in drafts) + 1
        vocab = self.target.vocab_size
        inputs = mx.concatenate([_padded(s.last, mx.clip(d.tokens, 0, vocab - 1), positions)
                                 for s, d in zip(starts, drafts)])
        logits, hidden = self.target.forward_batch(inputs, self.caches, offsets)
        stepping = [b for b, ask in enumerate(asks) if ask.budget > 0]
        masks = masks_of(rows, drafts, stepping, positions)
        verified = _verified(rows, starts, drafts, stepping, logits, positions, masks)
        members = []
        for b, (row, start, draft, asked) in enumerate(zip(rows, starts, drafts, asked)):
            if b not in verified:
                members.append(Member(row, None))
                continue
            g = draft.tokens.shape[0]
            kept, tokens, reports = verified[b]
            members.append(Member(row, Cycle(start, g, asked, draft.source, kept, tokens, hidden[b : b + 1, : g + 1], reports,
                                              draft.copied)))
        return members, positions, stages

    def _row_kv(self, offsets: mx.array, b: int) -> dict:
        """What a drafter reads of row b's K/V (SharedKV with the positions each slot holds)."""
        return {k: SharedKV(v.keys[b : b + 1], v.values[b : b + 1], v.lo[b : b + 1], v.hi[b : b + 1],
                            v.held if v.held.shape[0] == 1 else v.held[b : b + 1])
                for k, v in self.target.batch_drafter_buffers(self.caches, offsets).items()}

    def _assistant_inputs(self, starts: List[Start], offsets: mx.array, rows: List[int]) -> tuple:
        """The MTP assistant's inputs for these rows of the storage: last tokens, hidden states,
        positions (of the last settled token) and the K/V (of these rows only, if not all)."""
        kv = self.target.batch_drafter_buffers(self.caches, offsets)
        positions = offsets
        if len(rows) < len(starts):
            pick = mx.array(rows)
            kv = {k: SharedKV(v.keys[pick], v.values[pick], v.lo[pick], v.hi[pick], v.held if v.held.shape[0] == 1 else v.held[pick])
                  for k, v in kv.items()}
            positions = offsets[pick]
        last = mx.concatenate([starts[b].last for b in rows])
        hidden = mx.concatenate([starts[b].hidden for b in rows])
        return last, hidden, positions, kv


def _verified(rows, starts, drafts, stepping: List[int], logits: mx.array, positions: int, masks: dict) -> dict:
    """{row index: (kept, tokens, reports)} for the stepping rows. Rows whose guesses are kept by
    match and whose decoders verify alike (the same sampling settings and reports, a constraint
    or none) are verified together, in one compiled call over [rows, positions, V]: each row's
    guesses padded with -1 (no token), so that it keeps no more than its own, and each position's
    figures computed as the row's own call computes them. A row whose drafter sampled its
    guesses (the ratio rule) is verified alone."""
    out, groups = {}, {}
    drafts = {b: walkable_draft(drafts[b], masks[b][1]) if b in masks else drafts[b] for b in stepping}
    for b in stepping:
        builder = rows[b].decoder.builder
        if drafts[b].q is not None:
            g = drafts[b].tokens.shape[0]
            mask = masks[b][0][: g + 1] if b in masks else None
            out[b] = builder.verify(starts[b], logits[b, : g + 1], drafts[b], mask)
        else:
            groups.setdefault((builder.verifier.key, b in masks), []).append(b)
    for members in groups.values():
        verifier = rows[members[0]].decoder.builder.verifier
        picked = logits if len(members) == logits.shape[0] else logits[mx.array(members)]
        guesses = mx.stack([_padded_guesses(drafts[b].tokens, positions - 1) for b in members])
        uniforms = mx.stack([rows[b].decoder.builder.target_uniforms(starts[b], positions) for b in members])
        mask = mx.stack([masks[b][0] for b in members]) if members[0] in masks else None
        kept, tokens, reports = verifier.by_match(picked, guesses, uniforms, mask)
        for i, b in enumerate(members):
            out[b] = (kept[i], tokens[i], {k: v[i] for k, v in reports.items()})
    return out


def _padded_guesses(guesses: mx.array, n: int) -> mx.array:
    """[n]: the guesses, then -1 (which no token equals: nothing past a row's own is kept)."""
    pad = n - guesses.shape[0]
    guesses = guesses.astype(mx.int32)
    return mx.concatenate([guesses, mx.full((pad,), -1, mx.int32)]) if pad else guesses


class RowKV(Mapping):
    """A row's K/V for a drafter's context, made only if the drafter reads it (prompt lookup,
    say, never does)."""

    def __init__(self, make: Callable[[], dict]):
        self._make, self._kv = make, None

    def _get(self) -> dict:
        if self._kv is None:
            self._kv = self._make()
        return self._kv

    def __getitem__(self, kind):
        return self._get()[kind]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _offsets(starts: List[Start]) -> mx.array:
    """[B]: where each row's pass writes (its last settled token's position), on the device: the
    host knows it for a settled row, a row after a running cycle adds what that cycle keeps."""
    bases = mx.array([s.length - 1 for s in starts], mx.int32)
    aheads = [s.ahead for s in starts]
    if all(not isinstance(a, mx.array) for a in aheads):
        return bases + mx.array([a or 0 for a in aheads], mx.int32)
    return bases + mx.stack([a.astype(mx.int32).reshape(()) if isinstance(a, mx.array) else mx.array(a or 0, mx.int32)
                             for a in aheads])


def _padded(last: mx.array, guesses: mx.array, positions: int) -> mx.array:
    """[1, positions]: the last settled token, the guesses, then copies of the last token (their
    positions are computed and cut, as rejected guesses are)."""
    pad = positions - 1 - guesses.shape[0]
    parts = [last.astype(mx.int32), guesses.astype(mx.int32)[None]]
    if pad:
        parts.append(mx.broadcast_to(last.astype(mx.int32), (1, pad)))
    return mx.concatenate(parts, axis=1)
