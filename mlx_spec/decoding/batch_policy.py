"""How many guesses each row of a batch drafts: one cost model for the engine's batch steps,
combined with each row's own acceptance.

A batch step's time depends on the batch: its rows and its positions (the longest row's guesses
plus one: shorter rows are padded). `BatchDraftLength` learns T(B, L), the time of a step of B
rows and L positions, as the batch runs (a moving average per (B, L); for lengths not timed yet
at this B, a straight line through the ones that were, never below the prior of a guess costing
a quarter of a plain position). Each row brings its own acceptance a_1, a_2, ... (its decoder's
`AcceptanceStats`, which every settled cycle updates), so row b expects E_b(g) = 1 + a1 + a1 a2 +
... tokens from g guesses. The step drafts the g that maximises the batch's expected tokens per
second, sum_b E_b(g_b) / T(B, g + 1), g_b being g capped by the row's budget; a row with a fixed
draft length drafts that, a row without a drafter none. So a row may draft 0 beside rows that
draft 6, and where the pass becomes compute-bound as the batch grows (T grows with L), drafting
stops by itself.

As the single-sequence policy does (policy.py), the lengths next to the chosen one are measured
too (EXPLORE_TRIES steps each, while untimed), and while nothing is drafted a one-guess probe
now and then notices content where guessing pays again, less often after each probe that kept
nothing. A step that traced a compiled function is not timed.
"""

from typing import Dict, List, Optional, Tuple

from .policy import EXPLORE_TRIES, MAX_PROBE_INTERVAL, PER_GUESS, average, fit_line

PROBE_EVERY = 16  # plain steps between probes, doubled after each probe that kept nothing


class BatchDraftLength:
    def __init__(self, max_g: int, decay: float = 0.92):
        self.max_g, self.decay = max_g, decay
        self.seconds: Dict[Tuple[int, int], float] = {}  # (rows, positions) -> a step's time
        self.timed: Dict[Tuple[int, int], int] = {}
        self.explored: Dict[Tuple[int, int], int] = {}
        self.plain_streak = 0
        self.backoff = 1
        self.probing = False

    def choose(self, rows) -> List[int]:
        """Each row's g for the next step. A row has `decoder` (its drafter, fixed draft length
        and acceptance statistics) and `budget` (tokens still to generate)."""
        caps = [self._cap(row) for row in rows]
        fixed = [cap for cap, row in zip(caps, rows) if row.decoder.draft_tokens is not None]
        adaptive = [(cap, row.decoder.policy.stats) for cap, row in zip(caps, rows) if row.decoder.draft_tokens is None]
        if not adaptive or max(cap for cap, _ in adaptive) == 0:
            return caps
        limit = max(cap for cap, _ in adaptive)
        g = self._best(len(rows), limit, fixed, adaptive)
        self.probing = g == 0 and self.plain_streak >= min(PROBE_EVERY * self.backoff, MAX_PROBE_INTERVAL)
        if self.probing:
            g = 1
        return [cap if row.decoder.draft_tokens is not None else min(g, cap) for cap, row in zip(caps, rows)]

    def _cap(self, row) -> int:
        """The most guesses the row may draft: its fixed length or the adaptive bound, and never
        past its budget (a step settles up to g + 1 tokens)."""
        if row.decoder.drafter is None:
            return 0
        most = self.max_g if row.decoder.draft_tokens is None else row.decoder.draft_tokens
        return max(0, min(most, row.budget - 1))

    def _best(self, batch: int, limit: int, fixed: List[int], adaptive) -> int:
        """The g with the most expected tokens per second for the batch; then an untimed
        neighbour of it, to measure (a drafting length only: drafting at all is the probes')."""
        line = self._line(batch)
        floor = max(fixed, default=0)
        best, best_rate = 0, -1.0
        expected = [[stats.expected_tokens(min(g, cap)) for g in range(limit + 1)] for cap, stats in adaptive]
        for g in range(limit + 1):
            positions = max(g, floor) + 1
            seconds = self.seconds.get((batch, positions)) or line(positions)
            rate = sum(e[g] for e in expected) / seconds
            if rate > best_rate:
                best, best_rate = g, rate
        if best == 0:
            return best
        for n in (best + 1, best - 1):
            key = (batch, max(n, floor) + 1)
            if 1 <= n <= limit and key not in self.seconds and self.explored.get(key, 0) < EXPLORE_TRIES:
                self.explored[key] = self.explored.get(key, 0) + 1
                return n
        return best

    def _line(self, batch: int):
        """positions -> a step's time at this batch size, for lengths not timed yet: a line
        through this size's timed lengths; with fewer than two, the shape of the nearest
        size's line (how a step's cost grows with its positions), through this size's one
        time if it has one; the prior where nothing is known."""
        known = self._known(batch)
        if len(known) >= 2:
            return _fit(known)
        others = [b for b in {rows for rows, _ in self.seconds} if b != batch and len(self._known(b)) >= 2]
        if not others:
            shape = lambda positions: 1 + PER_GUESS * (positions - 1)  # noqa: E731
        else:
            shape = _fit(self._known(min(others, key=lambda b: abs(b - batch))))
        if not known:
            return shape
        positions, its_time = known[0]
        return lambda p: its_time * shape(p) / shape(positions)

    def _known(self, batch: int):
        return sorted((positions, t) for (rows, positions), t in self.seconds.items() if rows == batch)

    def observe(self, batch: int, positions: int, seconds: Optional[float], drafted: int, kept: int) -> None:
        """A settled step of `batch` rows over `positions` positions, `drafted` guesses of
        which `kept` were kept, in `seconds` (None: not timed, as when it traced)."""
        if drafted == 0:
            self.plain_streak += 1
        else:
            if self.probing:
                self.backoff = 2 * self.backoff if kept == 0 else 1
            self.plain_streak = 0
        self.probing = False
        if seconds is not None:
            key = (batch, positions)
            self.timed[key] = self.timed.get(key, 0) + 1
            self.seconds[key] = average(self.seconds.get(key, 0.0), seconds, self.timed[key], self.decay)

    def table(self) -> Dict[str, float]:
        """The measured step times, 'rows x positions' -> milliseconds (for the bench)."""
        return {f"{b}x{p}": 1000 * t for (b, p), t in sorted(self.seconds.items())}



def _fit(known):
    """fit_line through (positions, seconds), held below the shortest timed length to at least
    the prior's slope from it."""
    shortest, its_time = known[0]
    return fit_line(known, lambda p: its_time * (1 + PER_GUESS * (p - 1)) / (1 + PER_GUESS * (shortest - 1)))
