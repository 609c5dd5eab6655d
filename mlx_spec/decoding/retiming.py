"""Timing again a length the choice avoids (draft_lengths.py).

A length the choice avoids is not timed, so on a machine whose speed drifts it keeps the time it
had when the choice left it. Both ways go wrong:
- a plain step timed in a slow spell makes drafting look better than it is, and while the rows
  draft, no plain step is timed to mend it;
- a drafting length timed in a slow spell keeps the rows plain where drafting pays. Their probes
  do not mend it: a probe is not a step's time, and is rarely timed even as a probe where guesses
  are kept (one that keeps everything may be followed by a longer one at once, and a probe is
  timed only between plain steps).

So where the table puts the choice at less than RETIME_BELOW times the best avoided length's rate
(drift could reverse that), the avoided length runs RETIME_STEPS steps in a row (the loop times
the middle one: a step is timed only between two of its shape), once it has gone untimed for as
long as costs RETIME_OVERHEAD of the time: a step at 1/R of the choice's rate in its place loses
1 - 1/R of a step. Never in a request's first RETIME_AFTER cycles (its probe and climb, prompt
lookup's best chance), never for a length never timed (the line prices it, and errs cheap), and
never for a draft whose guesses are expected to add next to nothing (MIN_GAIN: a draft step
costs more than a plain one, whatever the drift).
"""

from typing import Dict, Optional, Tuple

from .policy import MIN_GAIN

RETIME_STEPS = 3  # steps in a row that time a length again (timed only between two of its shape)
RETIME_OVERHEAD = 0.005  # the share of the time timing avoided lengths again may cost
RETIME_BELOW = 1.5  # a choice this much faster than the avoided length by the table: drift could not reverse it
RETIME_AFTER = 32  # steps: a time younger is fresh enough (draft_lengths.STALE_DECAY weighs it 0.72)


class Retiming:
    """The avoided lengths timed again, for one engine's cost model."""

    def __init__(self):
        self.running: Dict[int, Tuple[int, int]] = {}  # rows -> (g being timed again, its steps still to run)

    def instead(self, lengths, batch: int, deciders, others: int, g: int) -> Optional[int]:
        """The g the deciding rows ((index, policy, cap) each) draft in place of g, to time it
        again; None: g itself. `others`: the other stepping rows, all plain. `lengths`: the
        engine's DraftLengths."""
        g_running, left = self.running.get(batch, (0, 0))
        if left > 0:
            self.running[batch] = (g_running, left - 1)
            return g_running
        if min(policy.cycles for _, policy, _ in deciders) < RETIME_AFTER:
            return None
        avoided = lengths.fastest(batch, deciders, shortest=1) if g == 0 else 0
        last = lengths.last_timed.get((batch, avoided + 1))
        if last is None or (g == 0 and tokens(deciders, others, avoided) - tokens(deciders, others, 0) < MIN_GAIN):
            return None
        ratio = rate(lengths, batch, deciders, others, g) / rate(lengths, batch, deciders, others, avoided)
        if ratio >= RETIME_BELOW:
            return None
        every = max(RETIME_AFTER, RETIME_STEPS * (1 - 1 / max(ratio, 1.0)) / RETIME_OVERHEAD)
        if lengths.steps - last < every:
            return None
        self.running[batch] = (avoided, RETIME_STEPS - 1)
        return avoided


def rate(lengths, batch: int, deciders, others: int, g: int) -> float:
    """The batch's expected tokens per second, by the table, where the deciding rows draft g and
    `others` rows step plain."""
    return tokens(deciders, others, g) / lengths.step_times(batch, [g + 1])[0]


def tokens(deciders, others: int, g: int) -> float:
    """The batch's expected tokens from a step where the deciding rows draft g."""
    return others + sum(policy.stats.expected_curve(g)[min(g, cap)] for _, policy, cap in deciders)
