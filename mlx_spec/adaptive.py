"""Choosing the draft length for each cycle from what the loop has measured.

The expected speed of a cycle with g guesses is E(g) / T(g): E(g) = 1 + a1 + a1 a2 + ... is the
expected number of tokens it settles (a_i: how often guess i is kept when the guesses before it
were), T(g) its wall time. Both are measured as the loop runs: a_i and T(g) as moving averages
over recent cycles, T of lengths not tried yet from a straight line through the ones that were.
g = 0 (one plain target step) is one of the choices, so drafting stops where it does not pay;
and while it is stopped, a short probe every few cycles notices when guessing pays again.
"""

from typing import Dict, List


class AdaptiveDraftLength:
    def __init__(self, max_g: int, first_g: int = 6, probe_every: int = 12, probe_g: int = 2, decay: float = 0.85):
        self.max_g = max_g
        self.decay = decay
        self.probe_every = probe_every
        self.probe_g = min(probe_g, max_g)
        self.acceptance: List[float] = [0.5] * max_g  # a_i, optimistic enough to try drafting
        self.seconds: Dict[int, float] = {}  # g -> moving average of a cycle's wall time
        self.plain_streak = 0
        # Measure a drafting cycle and a plain one before choosing.
        self.warmup = [min(first_g, max_g), 0] if max_g else [0]
        self.chosen: Dict[int, int] = {}

    def choose(self, budget: int) -> int:
        """g for the next cycle, at most budget - 1 (a cycle settles up to g + 1 tokens)."""
        limit = max(0, min(self.max_g, budget - 1))
        if self.warmup:
            g = self.warmup.pop(0)
        elif self.plain_streak >= self.probe_every:
            g = self.probe_g
        else:
            g = max(range(limit + 1), key=lambda n: self.expected_tokens(n) / self.cycle_seconds(n))
        g = min(g, limit)
        self.chosen[g] = self.chosen.get(g, 0) + 1
        return g

    def observe(self, g: int, kept: int, seconds: float) -> None:
        """A settled cycle: g guesses, the first `kept` of them kept, in `seconds`."""
        self.plain_streak = self.plain_streak + 1 if g == 0 else 0
        for i in range(min(g, kept + 1)):  # guess i was judged: all before it were kept
            hit = 1.0 if i < kept else 0.0
            self.acceptance[i] = self.decay * self.acceptance[i] + (1 - self.decay) * hit
        old = self.seconds.get(g)
        self.seconds[g] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def expected_tokens(self, g: int) -> float:
        total, run = 1.0, 1.0
        for a in self.acceptance[:g]:
            run *= a
            total += run
        return total

    def cycle_seconds(self, g: int) -> float:
        if g in self.seconds:
            return self.seconds[g]
        known = sorted(self.seconds.items())
        if len(known) < 2:
            return (known[0][1] if known else 1.0) * (1 + 0.25 * g)
        # Least squares line through the lengths measured so far.
        n = len(known)
        mean_g = sum(k for k, _ in known) / n
        mean_t = sum(t for _, t in known) / n
        spread = sum((k - mean_g) ** 2 for k, _ in known)
        slope = sum((k - mean_g) * (t - mean_t) for k, t in known) / spread
        return max(mean_t + slope * (g - mean_g), 1e-6)
