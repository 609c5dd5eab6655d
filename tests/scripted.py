"""Drafters with scripted acceptance, following mlx-spec's drafter protocol.

They propose a known continuation (what the target will produce), optionally broken at a chosen
draft position, so tests can make every cycle keep all guesses, none, or exactly j of them.
"""

import random

import mlx.core as mx

from mlx_spec.drafting import Draft, DraftContext, Drafter


class ScriptedDrafter(Drafter):
    """Proposes `reference[position + 1 : position + 1 + g]`, where `reference` is the whole
    expected token sequence (prompt and output). `break_at=j` replaces guess j (0-based) with a
    token that differs from the reference, so every cycle keeps exactly min(j, g) guesses.
    `break_probability` breaks each guess independently instead (seeded).
    strict=False lets the history leave the reference (sampling): guesses are then read at the
    same position of the reference, and padded with token 0 past its end. It reads the
    position only, on the device (the tokens just for a check): it may be drafted ahead of the
    host."""

    drafts_ahead = True

    def __init__(self, reference, vocab_size, break_at=None, break_probability=0.0, seed=0, strict=True, copied=False):
        self.strict = strict
        self.copied = copied  # its drafts marked as copied from the text, as prompt lookup's are
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.break_at = break_at
        self.break_probability = break_probability
        self.rng = random.Random(seed)
        self.calls = 0

    def draft(self, context: DraftContext, g: int) -> Draft:
        self.calls += 1
        if self.strict:  # the host may not have the last settled tokens yet (a cycle built ahead)
            assert context.tokens == self.reference[: len(context.tokens)], "drafter called on a state off the reference"
        broken = [i == self.break_at or bool(self.break_probability and self.rng.random() < self.break_probability)
                  for i in range(g)]
        return Draft(self.guesses(context.device_position, broken), copied=self.copied)

    def guesses(self, position: mx.array, broken) -> mx.array:
        """The reference's next len(broken) tokens after `position`, read on the device (the
        position may still be computed by the running cycle), each flagged one changed."""
        g = len(broken)
        if g == 0:
            return mx.zeros((0,), mx.int32)
        where = position + 1 + mx.arange(g)
        inside = where < self.reference_array.size
        right = mx.where(inside, mx.take(self.reference_array, mx.minimum(where, self.reference_array.size - 1)), 0)
        return mx.where(mx.array(broken), (right + 1) % self.vocab_size, right).astype(mx.int32)

    @property
    def reference_array(self) -> mx.array:
        if getattr(self, "_reference_array", None) is None:
            self._reference_array = mx.array(self.reference, mx.int32)
        return self._reference_array


class StepwiseDrafter(ScriptedDrafter):
    """A ScriptedDrafter that builds its guesses a step per piece, as the MTP drafter does
    (`draft_steps`), and logs each piece in `log`."""

    def __init__(self, *args, log=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = log if log is not None else []

    def draft_steps(self, context: DraftContext, g: int):
        guesses = self.draft(context, g).tokens
        steps = []
        for i in range(g):
            steps.append(guesses[i : i + 1] + 0)  # a step of its own in the graph
            self.log.append("piece")
            yield
        return Draft(mx.concatenate(steps) if steps else guesses, steps=steps)


def modelled_step_times(monkeypatch, per_position: float = 0.05, every_step: bool = True) -> None:
    """The engines' cost models see modelled times, not this machine's: a step of L positions
    takes 1 + per_position (L - 1) seconds, and a probe between plain steps costs
    per_position (L - 1) more than a plain one, so that the choices do not hang on how busy the
    machine is (the tokens never do). every_step: every step counts as timed (False: the loop
    still decides which are)."""
    from mlx_spec.decoding.draft_lengths import DraftLengths

    observe, observe_probe = DraftLengths.observe, DraftLengths.observe_probe
    monkeypatch.setattr(DraftLengths, "observe", lambda self, rows, positions, seconds: observe(
        self, rows, positions, None if seconds is None and not every_step else 1.0 + per_position * (positions - 1)))
    monkeypatch.setattr(DraftLengths, "observe_probe", lambda self, rows, positions, extra: observe_probe(
        self, rows, positions, per_position * (positions - 1)))
