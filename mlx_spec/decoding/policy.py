"""How many guesses each cycle drafts: a policy object the loop always has, and the acceptance
statistics it and the loop's outcome prediction read.

`AcceptanceStats`: how often guess i is kept when the guesses before it were (a_i, moving
averages); from them the expected tokens of a cycle.

`FixedDraftLength`: g guesses every cycle (MTP off is g = 0).

`AdaptiveDraftLength`: the g with the best expected speed E(g) / T(g), E(g) = 1 + a1 + a1 a2 + ...
the expected tokens a cycle settles, T(g) its wall time, both measured as the loop runs (T of
lengths not tried yet from a straight line through the ones that were; a cycle that traced a
compiled function is not timed). g = 0 (one plain target step) is one of the choices, so
drafting stops where it does not pay; and while it is
stopped, a short probe now and then (as often as costs about 1% of the time) notices when
guessing pays again; a probe that keeps all its guesses is followed by one four times as long
(up to max_g), so that a run where everything is kept reaches its best length in two cycles.
Each probe in a row that keeps nothing doubles the wait before the next, up to
MAX_PROBE_INTERVAL plain cycles (a second or two of decoding), so that content where nothing is
ever kept pays less for the exploring; a probe that keeps anything resets it.

The line is only a guess: a pass's cost can jump between two lengths (matmul kernels change
with the number of rows), and at a = 1 the line always favours the longest draft. So the
lengths next to the chosen one are measured too, each at most EXPLORE_TRIES times while it has
no time of its own: the choice climbs to the best measured length instead of stopping where
the line pointed.
"""

from typing import Dict, List, Optional

MAX_PROBE_INTERVAL = 128  # plain cycles
PER_GUESS = 0.25  # the cost model's prior: a guess adds a quarter of a plain cycle
EXPLORE_TRIES = 2  # cycles a neighbouring length is tried for a time (the first may trace, untimed)


class AcceptanceStats:
    """a_i: how often guess i was kept when every guess before it was, as moving averages
    (a plain mean over the first observations). A guess position never judged is assumed to do
    as well as the deepest one that was (0.5 before any), so longer drafts get tried when
    short ones all pass."""

    def __init__(self, max_g: int, decay: float = 0.92):
        self.decay = decay
        self.acceptance: List[float] = [0.5] * max_g
        self.judged: List[int] = [0] * max_g

    def observe(self, g: int, kept: int, weight: Optional[float] = None) -> None:
        """A cycle with g guesses kept its first `kept`. `weight`: at least this much weight for
        the news (a probe's, rare news about content that may have changed)."""
        for i in range(min(g, kept + 1, len(self.acceptance))):  # guess i was judged: all before it were kept
            self.judged[i] += 1
            self.acceptance[i] = average(self.acceptance[i], 1.0 if i < kept else 0.0, self.judged[i], self.decay, weight)

    def rates(self, g: int) -> List[float]:
        """a_1 .. a_g as the predictions use them (unjudged positions as the deepest judged)."""
        out, last = [], 0.5
        for i in range(g):
            if self.judged[i]:
                last = self.acceptance[i]
            out.append(last)
        return out

    def expected_tokens(self, g: int) -> float:
        """E(g) = 1 + a1 + a1 a2 + ...: the tokens a cycle with g guesses is expected to settle."""
        total, run = 1.0, 1.0
        for a in self.rates(g):
            run *= a
            total += run
        return total


def average(old: float, new: float, count: int, decay: float, weight: Optional[float] = None) -> float:
    """A plain mean over the first observations, a moving average after them."""
    weight = max(1.0 / count, weight or 1 - decay)
    return (1 - weight) * old + weight * new


class FixedDraftLength:
    """g guesses every cycle (fewer where the budget ends sooner); g = 0 is MTP off."""

    def __init__(self, g: int, stats: AcceptanceStats):
        self.g, self.stats = g, stats

    def choose(self, budget: int) -> int:
        return max(0, min(self.g, budget - 1))

    def observe(self, g: int, kept: int, seconds: Optional[float], asked: Optional[int] = None) -> None:
        self.stats.observe(g, kept)

    def withdraw(self) -> None:
        """Nothing was handed out that could be lost."""



class AdaptiveDraftLength:
    def __init__(self, max_g: int, stats: Optional[AcceptanceStats] = None, first_probe: int = 2, probe_g: int = 1,
                 probe_overhead: float = 0.01, decay: float = 0.92):
        self.max_g = max_g
        self.decay = decay
        self.stats = stats if stats is not None else AcceptanceStats(max_g, decay)
        self.probe_g = min(probe_g, max_g)
        self.probe_overhead = probe_overhead
        self.seconds: Dict[int, float] = {}  # g -> moving average of a cycle's wall time
        self.timed: Dict[int, int] = {}
        self.plain_streak = 0
        # g of the probe in progress (0: none). The first cycles are a probe: a short draft,
        # four times as long each time all its guesses are kept, until one misses.
        self.probe = min(first_probe, max_g)
        # Whether the probe was handed out and has not been observed yet: the loop chooses the
        # next cycle's length while the current one runs, and must not probe twice for one.
        self.probe_out = False
        self.backoff = 1  # multiplies the probe interval: doubled by each probe that keeps nothing
        self.explored: Dict[int, int] = {}  # g -> cycles handed out to measure it (see `_neighbour`)

    def choose(self, budget: int) -> int:
        """g for the next cycle, at most budget - 1 (a cycle settles up to g + 1 tokens)."""
        limit = max(0, min(self.max_g, budget - 1))
        probing = not self.probe_out and (self.probe or self.plain_streak >= self.probe_every())
        if probing:
            g = self.probe = self.probe or self.probe_g
        else:
            g = self._neighbour(self._fastest(limit), limit)
        g = min(g, limit)
        self.probe_out = self.probe_out or (probing and g > 0)
        return g

    def _fastest(self, limit: int) -> int:
        """The g in 0..limit with the most expected tokens per second, E(g) / T(g) (the shortest
        on a tie), in one pass: this runs every cycle, and a plain cycle of a small model takes
        a few milliseconds. T(g) is the measured time, or the line's (`_line`) for a length
        not measured yet, and never less than a shorter draft's: noise (or a cycle whose time
        hid behind the next one's build) must not make a longer draft look cheaper, least of all
        where no guess is kept and every length settles one token."""
        line, rates = self._line(), self.stats.rates(limit)
        best, best_rate, total, run, slowest = 0, -1.0, 1.0, 1.0, 0.0
        for g in range(limit + 1):
            if g > 0:
                run *= rates[g - 1]
                total += run
            seconds = max(self.seconds[g] if g in self.seconds else line(g), slowest)
            if total / seconds > best_rate:
                best, best_rate = g, total / seconds
            if g in self.seconds:
                slowest = max(slowest, self.seconds[g])
        return best

    def _neighbour(self, g: int, limit: int) -> int:
        """A length next to g (longer first) that has no measured time yet, to measure it; else
        g. Drafting lengths only: whether to draft at all is the probes' question."""
        if g == 0:
            return g
        for n in (g + 1, g - 1):
            if 1 <= n <= limit and n not in self.seconds and self.explored.get(n, 0) < EXPLORE_TRIES:
                self.explored[n] = self.explored.get(n, 0) + 1
                return n
        return g

    def withdraw(self) -> None:
        """The cycle last chosen for was thrown away unrun: a probe handed out for it is handed
        out again."""
        self.probe_out = False

    def observe(self, g: int, kept: int, seconds: Optional[float], asked: Optional[int] = None) -> None:
        """A settled cycle: g guesses, the first `kept` of them kept, in `seconds` (None: its
        time says nothing of such a cycle's cost, as when it traced a compiled function).
        `asked`: the g it was chosen with, when its drafter proposed fewer. A cycle chosen with
        no guesses leaves a probe that is out alone: the loop chooses a cycle while the one
        before runs."""
        asked = g if asked is None else asked
        self.plain_streak = self.plain_streak + 1 if asked == 0 else 0
        probing = asked > 0 and asked == self.probe
        # A probe is rare news about content that may have changed: it weighs more.
        self.stats.observe(g, kept, 0.3 if probing else None)
        if asked > 0:
            # A probe that kept everything is followed by a longer one; a miss ends probing.
            self.probe = min(4 * g, self.max_g) if probing and kept == g == asked and g < self.max_g else 0
            self.probe_out = False
            if probing and g > 0:  # (a drafter that proposed nothing told nothing)
                self.backoff = 2 * self.backoff if kept == 0 else 1
        if seconds is not None:
            self.timed[g] = self.timed.get(g, 0) + 1
            self.seconds[g] = average(self.seconds.get(g, 0.0), seconds, self.timed[g], self.decay)

    def probe_every(self) -> int:
        """Plain cycles between probes, so that probing costs about `probe_overhead` of the
        time: a probe's extra cost over a plain cycle, spread over the cycles in between
        (every few cycles where a short draft is nearly free, as on a GPU; rarely where a draft
        step costs nearly a target pass). At most MAX_PROBE_INTERVAL cycles, so that content
        where guessing pays again is noticed within a second or two."""
        if 0 not in self.seconds or self.probe_g not in self.seconds:
            return min(16 * self.backoff, MAX_PROBE_INTERVAL)
        extra = max(self.seconds[self.probe_g] / self.seconds[0] - 1, 0.0)
        return int(min(max(extra / self.probe_overhead, 4) * self.backoff, MAX_PROBE_INTERVAL))

    def _line(self):
        """g -> the time of a cycle with g guesses, for lengths not measured yet: a least squares
        line through the ones that were. Below the shortest measured length it is held to at
        least the prior (each guess PER_GUESS of a plain cycle more, from that length's time):
        two neighbouring lengths timed with noise can tilt the line to nothing at g = 0, and a
        plain cycle then looked free (the small shape drafted nothing for two cycles at a = 1).
        With fewer than two measured, the prior alone."""
        known = sorted(self.seconds.items())
        if not known:
            return lambda g: 1 + PER_GUESS * g
        shortest, its_time = known[0]

        def prior(g):
            return its_time * (1 + PER_GUESS * g) / (1 + PER_GUESS * shortest)

        return prior if len(known) < 2 else fit_line(known, prior)


def fit_line(known, prior):
    """A least-squares line through (length, seconds) points (two or more), never below zero,
    and below the shortest length never below `prior`."""
    shortest, n = known[0][0], len(known)
    mean_x = sum(k for k, _ in known) / n
    mean_t = sum(t for _, t in known) / n
    spread = sum((k - mean_x) ** 2 for k, _ in known)
    slope = sum((k - mean_x) * (t - mean_t) for k, t in known) / spread
    return lambda x: max(mean_t + slope * (x - mean_x), prior(x) if x < shortest else 1e-6)
