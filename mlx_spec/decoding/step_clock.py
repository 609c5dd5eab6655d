"""What a step costs the loop, timed at its syncs, for the engine's cost model (draft_lengths.py).

Steps run back to back, so the time from one step's sync to the next is the device's time on
that step where the device is the bottleneck, and the host's work per step (settling, handing
over, building) where the host is. But an interval holds some of its neighbours' work: on MLX's
CPU backend a step queued whole is computed as it is queued, inside the interval before its own.
So a step is timed on its own only where the steps before and after it have its shape (what its
interval holds of theirs then costs what it holds of its own). Not a step that traced a compiled
function, follows other work (a prompt's chunk), or ends the run (its sync comes at once and
would read as free).

A probe (policy.py) is a drafting step alone between plain ones, so it is never timed that way.
What it costs is what the loop pays for it: the three intervals around it (the one it is queued
in, its own, the one after) less three plain steps' time. That extra is what a probe's interval
weighs; a line through the drafting lengths (where drafts cost in proportion to their positions)
misses a draft step's fixed cost, and on this project's CPU put a probe at half its real cost.
"""

from collections import deque
from typing import Deque, Optional, Tuple

Shape = Tuple[int, int]  # a step's (rows, positions)


class StepClock:
    def __init__(self, lengths):
        """lengths: the engine's cost model (DraftLengths), which the times go to."""
        self.lengths = lengths
        self.last_sync: Optional[float] = None  # when the last step synced (None: other work since)
        # (shape, seconds since the sync before, None: not a step's own time) of the last steps
        self.recent: Deque[Tuple[Shape, Optional[float]]] = deque(maxlen=4)

    def interrupt(self) -> None:
        """Other work (a prompt's chunk) runs before the next step: its time is no step's."""
        self.last_sync = None
        self.recent.clear()

    def settled(self, step, ahead, synced: float) -> None:
        """`step` synced at `synced`; `ahead`: the step queued behind it (None: none)."""
        since, self.last_sync = self.last_sync, synced
        interval = synced - since if since is not None and not step.traced else None
        before = self.recent[-1][0] if self.recent else None
        self.recent.append((step.shape, interval))
        if not step.rows:
            return
        timed = interval is not None and ahead is not None and before == step.shape == ahead.shape
        if self.lengths.trace is not None:
            self.lengths.trace.append(self._traced(step, interval, timed))
        self.lengths.observe(step.rows, step.positions, interval if timed else None)
        probe = self._lone_probe(ahead)
        if probe is not None:
            self.lengths.observe_probe(*probe)

    def _traced(self, step, interval: Optional[float], timed: bool) -> dict:
        """A settled step as `bench batch --trace` records it: its shape, each stepping row's
        g (as asked for), the interval since the sync before (None: other work came
        between), whether that was the step's own time, and what the cost model expected of a
        step of its shape and of a plain step of its rows, before this step taught it."""
        known = any(rows == step.rows for rows, _ in self.lengths.seconds)  # (else the line is the unitless prior)
        expected, plain = self.lengths.step_times(step.rows, [step.positions, 1]) if known else (None, None)
        return {"rows": step.rows, "positions": step.positions, "asked": [m.cycle.asked for m in step.stepping],
                "seconds": interval, "timed": timed, "expected": expected, "plain_expected": plain}

    def _lone_probe(self, ahead) -> Optional[tuple]:
        """(rows, positions, extra seconds) of the step before last, where it drafted between
        plain steps of its rows: two before it, this one and the one queued after; else None.
        Whether it is follows from shapes and traces only, the same on every rank of a group."""
        if ahead is None or len(self.recent) < 4:
            return None
        (first, _), (before, ahead_of_it), (probe, its_own), (after, after_it) = self.recent
        rows = probe[0]
        plain = (rows, 1)
        if probe[1] < 2 or not first == before == after == ahead.shape == plain:
            return None
        plain_seconds = self.lengths.seconds.get(plain)
        if None in (ahead_of_it, its_own, after_it, plain_seconds):
            return None
        return rows, probe[1], ahead_of_it + its_own + after_it - 3 * plain_seconds
