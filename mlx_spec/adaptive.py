"""Choosing the draft length for each cycle from what the loop has measured.

The expected speed of a cycle with g guesses is E(g) / T(g): E(g) = 1 + a1 + a1 a2 + ... is the
expected number of tokens it settles (a_i: how often guess i is kept when the guesses before it
were), T(g) its wall time. Both are measured as the loop runs: a_i and T(g) as moving averages
over recent cycles, T of lengths not tried yet from a straight line through the ones that were.
g = 0 (one plain target step) is one of the choices, so drafting stops where it does not pay;
and while it is stopped, a short probe now and then (as often as costs about 1% of the time)
notices when guessing pays again; a probe that keeps all its guesses is followed by one four
times as long (up to max_g), so that a run where everything is kept reaches its best length in
two cycles.
"""

from typing import Dict, List, Optional

MAX_PROBE_INTERVAL = 128  # plain cycles


class AdaptiveDraftLength:
    def __init__(self, max_g: int, first_probe: int = 2, probe_g: int = 1, probe_overhead: float = 0.01, decay: float = 0.92):
        self.max_g = max_g
        self.decay = decay
        self.probe_g = min(probe_g, max_g)
        self.probe_overhead = probe_overhead
        self.acceptance: List[float] = [0.5] * max_g  # a_i, moving averages
        self.judged: List[int] = [0] * max_g  # how often guess i was judged
        self.seconds: Dict[int, float] = {}  # g -> moving average of a cycle's wall time
        self.timed: Dict[int, int] = {}
        self.plain_streak = 0
        # g of the probe in progress (0: none). The first cycles are a probe: a short draft,
        # four times as long each time all its guesses are kept, until one misses.
        self.probe = min(first_probe, max_g)
        # Whether the probe was handed out and has not been observed yet: the loop chooses the
        # next cycle's length while the current one runs, and must not probe twice for one.
        self.probe_out = False
        self.chosen: Dict[int, int] = {}

    def choose(self, budget: int) -> int:
        """g for the next cycle, at most budget - 1 (a cycle settles up to g + 1 tokens)."""
        limit = max(0, min(self.max_g, budget - 1))
        probing = not self.probe_out and (self.probe or self.plain_streak >= self.probe_every())
        if probing:
            g = self.probe = self.probe or self.probe_g
        else:
            g = self._fastest(limit)
        g = min(g, limit)
        self.probe_out = self.probe_out or (probing and g > 0)
        self.chosen[g] = self.chosen.get(g, 0) + 1
        return g

    def _fastest(self, limit: int) -> int:
        """The g in 0..limit with the most expected tokens per second (the shortest on a tie).
        The same figures as `expected_tokens` and `cycle_seconds`, computed in one pass: this
        runs every cycle, and a plain cycle of a small model takes a few milliseconds."""
        line = self._line()
        best, best_rate, total, run, last, slowest = 0, -1.0, 1.0, 1.0, 0.5, 0.0
        for g in range(limit + 1):
            if g > 0:
                if self.judged[g - 1]:
                    last = self.acceptance[g - 1]
                run *= last
                total += run
            seconds = max(self.seconds[g] if g in self.seconds else line(g), slowest)
            if total / seconds > best_rate:
                best, best_rate = g, total / seconds
            if g in self.seconds:
                slowest = max(slowest, self.seconds[g])
        return best

    def withdraw(self) -> None:
        """The cycle last chosen for was thrown away unrun: a probe handed out for it is handed
        out again."""
        self.probe_out = False

    def observe(self, g: int, kept: int, seconds: float, asked: Optional[int] = None) -> None:
        """A settled cycle: g guesses, the first `kept` of them kept, in `seconds`. `asked`: the
        g it was chosen with, when its drafter proposed fewer. A cycle chosen with no guesses
        leaves a probe that is out alone: the loop chooses a cycle while the one before runs."""
        asked = g if asked is None else asked
        self.plain_streak = self.plain_streak + 1 if asked == 0 else 0
        probing = asked > 0 and asked == self.probe
        for i in range(min(g, kept + 1)):  # guess i was judged: all before it were kept
            self.judged[i] += 1
            # A probe is rare news about content that may have changed: it weighs more.
            weight = 0.3 if probing else None
            self.acceptance[i] = self._average(self.acceptance[i], 1.0 if i < kept else 0.0, self.judged[i], weight)
        if asked > 0:
            # A probe that kept everything is followed by a longer one; a miss ends probing.
            self.probe = min(4 * g, self.max_g) if probing and kept == g == asked and g < self.max_g else 0
            self.probe_out = False
        self.timed[g] = self.timed.get(g, 0) + 1
        self.seconds[g] = self._average(self.seconds.get(g, 0.0), seconds, self.timed[g])

    def probe_every(self) -> int:
        """Plain cycles between probes, so that probing costs about `probe_overhead` of the
        time: a probe's extra cost over a plain cycle, spread over the cycles in between
        (every few cycles where a short draft is nearly free, as on a GPU; rarely where a draft
        step costs nearly a target pass). At most MAX_PROBE_INTERVAL cycles, so that content
        where guessing pays again is noticed within a second or two."""
        if 0 not in self.seconds or self.probe_g not in self.seconds:
            return 16
        extra = max(self.seconds[self.probe_g] / self.seconds[0] - 1, 0.0)
        return int(min(max(extra / self.probe_overhead, 4), MAX_PROBE_INTERVAL))

    def _average(self, old: float, new: float, count: int, weight=None) -> float:
        """A plain mean over the first observations, a moving average after them."""
        weight = max(1.0 / count, weight or 1 - self.decay)
        return (1 - weight) * old + weight * new

    def expected_tokens(self, g: int) -> float:
        """1 + a1 + a1 a2 + ...; a guess position never judged yet is assumed to do as well as
        the deepest one that was (so longer drafts get tried when short ones all pass)."""
        total, run, last = 1.0, 1.0, 0.5
        for i in range(g):
            if self.judged[i]:
                last = self.acceptance[i]
            run *= last
            total += run
        return total

    def likely_outcome(self, g: int):
        """(tokens, probability): the most likely number of tokens a cycle with g guesses
        settles, from the measured acceptance by guess position, and how likely it is."""
        best, best_p, run = 0, -1.0, 1.0
        for k in range(g + 1):
            a = self.acceptance[k] if k < g else 0.0
            p = run * (1 - a)  # the first k kept, then a miss (or all g kept)
            if p > best_p:
                best, best_p = k, p
            run *= a
        return best + 1, best_p

    def cycle_seconds(self, g: int) -> float:
        """A cycle's time with g guesses: measured, or from a line through the lengths that
        were. Never less than a shorter draft's: noise (or a cycle whose time hid behind the
        next one's build) must not make a longer draft look cheaper, least of all where no
        guess is kept and every length settles one token."""
        shorter = [t for k, t in self.seconds.items() if k < g]
        return max([self.seconds[g] if g in self.seconds else self._line()(g), *shorter])

    def _line(self):
        """g -> the time of a cycle with g guesses, for lengths not measured yet: a least squares
        line through the ones that were (with fewer than two, 25% more per guess)."""
        known = sorted(self.seconds.items())
        if len(known) < 2:
            base = known[0][1] if known else 1.0
            return lambda g: base * (1 + 0.25 * g)
        n = len(known)
        mean_g = sum(k for k, _ in known) / n
        mean_t = sum(t for _, t in known) / n
        spread = sum((k - mean_g) ** 2 for k, _ in known)
        slope = sum((k - mean_g) * (t - mean_t) for k, t in known) / spread
        return lambda g: max(mean_t + slope * (g - mean_g), 1e-6)
