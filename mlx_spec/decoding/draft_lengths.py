"""How many guesses each row of a step drafts: one cost model for the engine, each row's own
acceptance. A generation alone is a step of one row; several requests at once are a step of
several (batch.py).

A step's time depends on its rows and its positions (the longest row's guesses plus one: shorter
rows are padded). `DraftLengths` learns T(B, L), the time of a step of B rows over L positions,
once per engine: every generation on it, alone or batched, times its steps into the same table
(a moving average per (B, L); for lengths not timed yet at this B, a straight line through the
ones that were, or the shape of the nearest B's line, never below the prior of a guess costing
a quarter of a plain position). A step that traced a compiled function is not timed. A probe
(a drafting step alone between plain ones: policy.py) is never timed as a step, so what it costs
the loop is measured apart (step_clock.py) and weighs its interval.

Each row brings its own acceptance (`DraftLength`, policy.py), so row b expects E_b(g) tokens from
g guesses. The step drafts the g that maximises the batch's expected tokens per second,
sum_b E_b(g_b) / T(B, g + 1), g_b being g capped by the row's budget, T never above a longer
draft's measured time (noise slows steps: an error that makes a length look cheap gets it chosen
and timed again, one that makes it look dear would stay). A row with a fixed
length drafts that, a row without a drafter none, a row whose probe is due its probe (with the
rows whose probes are nearly due: policy.py); and beside
rows that gain from the drafts, or in a step another row's probe widens, a row whose own gain is
next to nothing drafts none (its probes keep watching): its drafting work would cost every row of
the batch for nothing. A probe that prompt lookup alone makes widens no step where it finds
nothing, so the others do not count on its width. So a row may draft 0 beside rows that draft 6,
and where the pass becomes compute-bound as the batch grows (T grows with L), drafting stops by
itself.

On a machine whose speed drifts, times taken at different moments drift apart: a time weighs
less the older it is, and a length the choice avoids is timed again now and then (retiming.py).

The line is only a guess: a pass's cost can jump between two lengths (matmul kernels change with
the number of rows), and at a = 1 the line always favours the longest draft. So the lengths next
to the chosen one are measured too, each at most EXPLORE_TRIES times while untimed: the choice
climbs to the best measured length instead of stopping where the line pointed.
"""

from typing import Dict, List, NamedTuple, Optional, Tuple

from .limits import MAX_DRAFT_TOKENS
from .batch_margins import best_length, worth_trying
from .step_lines import line, timed_at
from .lockstep import Lockstep
from .acceptance_stats import AcceptanceStats, average
from .policy import DUE, MIN_GAIN, DraftLength, probe_terms
from .retiming import Retiming

EXPLORE_TRIES = 3  # steps in a row a neighbouring length is tried: a step is timed only between two of its shape
PRIOR_DECAY = 0.98  # the engine's pooled acceptance: a slower moving average than a request's own
STALE_DECAY = 0.99  # per step since a length was last timed: how much its old time still says
# A timing over this many times its length's figure counts as this many: one step the machine
# paused in (another process, a collection) would move the average by 0.08 of its excess. On this
# project's CPU such steps left a plain step's figure at 1.6 times its run's median at the run's
# end. A lasting slowdown is still followed, by up to 4% a step.
CLIP = 1.5


class Ask(NamedTuple):
    """What the choice reads of a row: its draft length (None: no drafter) and the tokens it may
    still make (0: it sits the step out)."""

    policy: Optional[DraftLength]
    budget: int


class DraftLengths:
    def __init__(self, decay: float = 0.92, lockstep: Optional[Lockstep] = None):
        """lockstep: the group whose ranks must choose alike (lockstep.py): every rank learns
        rank 0's step times."""
        self.decay = decay
        self.lockstep = lockstep or Lockstep()
        # How guesses fare on this engine, pooled over its requests: where each request's own
        # statistics start (policy.py). Guesses copied from a request's own text (prompt lookup)
        # are left out: they say how that text repeats itself, not how the next one is guessed.
        self.acceptance = AcceptanceStats(MAX_DRAFT_TOKENS, PRIOR_DECAY, quick_decay=None)
        self.seconds: Dict[Tuple[int, int], float] = {}  # (rows, positions) -> a step's time
        self.timed: Dict[Tuple[int, int], int] = {}
        # The steps settled so far (timed or not): the clock by which a time grows old. Steps,
        # not seconds: every rank of a group counts them alike.
        self.steps = 0
        self.last_timed: Dict[Tuple[int, int], int] = {}  # (rows, positions) -> the step it was last timed at
        self.retiming = Retiming()  # the lengths the choice avoids, timed again now and then
        self.explored: Dict[Tuple[int, int], int] = {}
        # What a probe (a drafting step alone between plain ones) costs over a plain step, as
        # the loop measures it (step_clock.py): (rows, positions) -> seconds.
        self.probe_extra: Dict[Tuple[int, int], float] = {}
        self.probes_timed: Dict[Tuple[int, int], int] = {}
        # While a step is chosen: step times by (rows, positions), and a probe's times by
        # ("probe", rows, its g), which every row of a batch asks for.
        self._memo: Optional[dict] = None
        # Each settled step's shape, g per row, time and expected time, where the bench asks for
        # them (`bench batch --trace`: step_clock.py appends); None: not recorded.
        self.trace: Optional[List[dict]] = None

    def choose(self, asks: List[Ask]) -> List[int]:
        """Each row's g for the next step of these rows (probes handed out are marked so)."""
        # The table holds still while a step is chosen, and the choice reads a length's time
        # several times (the best length, the retiming's rates): each is worked out once. This
        # runs on the host every step, beside a plain step of a few milliseconds.
        self._memo = {}
        try:
            return self._choose(asks)
        finally:
            self._memo = None

    def _choose(self, asks: List[Ask]) -> List[int]:
        batch, gs, deciders = len(asks), [0] * len(asks), []
        stepping = sum(a.budget > 0 for a in asks)
        wanted = {}
        for i, (policy, budget) in enumerate(asks):
            if policy is None or budget <= 0:
                continue
            cap = policy.cap(budget)
            if policy.first and cap and self.fastest(batch, [(i, policy, cap)]) > 0:
                policy.skip_first_probe()  # the engine's acceptance already drafts: no need to probe
            elif policy.first and cap and self._assistant_not_worth_probing(policy, batch):
                policy.free_first_probe()
            if not policy.adaptive:
                gs[i] = cap
                continue
            wanted[i] = policy.probe_wanted(self._probe_every(policy, batch), alone=stepping == 1)
            deciders.append((i, policy, cap))
        if DUE in wanted.values():  # one probe step, shared by every row whose probe is near
            for i, policy, cap in [d for d in deciders if wanted[d[0]]]:
                gs[i] = min(policy.take_probe(), cap)
                policy.handed_out(gs[i])
            deciders = [d for d in deciders if not wanted[d[0]]]
        if deciders:
            # A probe the free drafters alone make (prompt lookup) drafts nothing where they find
            # nothing: it widens the step only then, so the others may not count on its width.
            others = [(a.policy, 0 if a.policy is not None and a.policy.free_only else gs[i])
                      for i, a in enumerate(asks) if a.budget > 0 and i not in {d[0] for d in deciders}]
            for (i, policy, cap), g in zip(deciders, self._best(batch, deciders, others)):
                gs[i] = g
        return gs

    def _best(self, batch: int, deciders, others) -> List[int]:
        """The deciding rows' g: the fastest common length (`fastest`), or an untimed neighbour
        of it, to time it; beside rows that gain from it, a row that gains next to nothing
        drafts none."""
        floor = max((g for _, g in others), default=0)
        limit = max(cap for _, _, cap in deciders)
        rates = self.rates(batch, deciders, others)
        best = self._neighbour(batch, best_length(rates, batch), limit, floor, rates if batch > 1 else None)
        instead = self.retiming.instead(self, batch, deciders, len(others), best) if floor == 0 else None
        best = best if instead is None else instead
        if best == 0:
            return [0] * len(deciders)
        gains = [policy.stats.expected_tokens(min(best, cap)) - 1 for _, policy, cap in deciders]
        # Next to nothing to gain: beside rows that gain, or in a step whose width other rows set
        # (a probe's), the row's drafting work would cost the whole batch for it: it drafts none.
        alongside = floor > 0 or MIN_GAIN <= max(gains)
        return [0 if gain < MIN_GAIN and alongside else min(best, cap) for gain, (_, _, cap) in zip(gains, deciders)]

    def fastest(self, batch: int, deciders, others=(), shortest: int = 0) -> int:
        """The common g of the deciding rows ((index, policy, cap) each) with the most expected
        tokens per second for the batch (`rates`, batch_margins.best_length); none shorter than `shortest`.
        Where no guess of theirs is expected to be kept, none (only noise makes a draft look
        cheaper than a plain step), without weighing the lengths: at zero acceptance this is
        every step."""
        return best_length(self.rates(batch, deciders, others), batch, shortest)

    def rates(self, batch: int, deciders, others=()) -> Optional[List[float]]:
        """The batch's expected tokens per second at each common g of the deciding rows, 0 up to
        the longest cap, in one pass (this runs every step); None where no guess of theirs is
        expected to be kept.
        `others`: the other stepping rows' (policy or None, g). A step's time: `step_times`."""
        floor = max((g for _, g in others), default=0)
        settled = sum(p.stats.expected_tokens(g) if p is not None else 1.0 for p, g in others)
        limit = max(cap for _, _, cap in deciders)
        curves = [(policy.stats.expected_curve(limit), cap) for _, policy, cap in deciders]
        if all(curve[cap] <= 1.0 for curve, cap in curves):
            return None
        times = self.step_times(batch, [max(g, floor) + 1 for g in range(limit + 1)])
        return [(settled + sum(curve[min(g, cap)] for curve, cap in curves)) / seconds for g, seconds in enumerate(times)]

    def step_times(self, batch: int, positions: List[int]) -> List[float]:
        """A step's time over each of these positions: the measured one, or the
        line's (`_line`) where not measured yet, and never more than a longer step's measured
        time. Noise on a shared machine slows steps; it does not speed them up. A step timed
        slow by it, kept in its moving average, would hold the choice away from its length
        (and, were it a floor for longer lengths, from every longer one), and a length not
        chosen is not timed again to mend it. Held to the cheapest longer step instead, a
        length errs only cheap, and a length that looks cheap is chosen and timed again; one
        held to a longer step's time is never chosen over it (same time, fewer tokens)."""
        memo = self._memo if self._memo is not None else {}
        missing = [p for p in positions if (batch, p) not in memo]
        if missing:
            line, known = None, self._known(batch)
            for p in missing:
                measured = self.seconds.get((batch, p))
                if measured is None:
                    line = line or self._line(batch)
                    measured = line(p)
                memo[(batch, p)] = min([measured, *(t for timed, t in known if timed > p)])
        return [memo[(batch, p)] for p in positions]

    def _neighbour(self, batch: int, g: int, limit: int, floor: int, rates: Optional[List[float]] = None) -> int:
        """A length next to g (longer first) not timed yet, to time it; else g. Drafting lengths
        only: whether to draft at all is the probes' question. `rates` (a batch's): only a
        neighbour worth trying (batch_margins.worth_trying)."""
        if g == 0:
            return g
        for n in (g + 1, g - 1):
            key = (batch, max(n, floor) + 1)
            if not 1 <= n <= limit or not worth_trying(rates, n, g):
                continue
            if key not in self.seconds and self.explored.get(key, 0) < EXPLORE_TRIES:
                self.explored[key] = self.explored.get(key, 0) + 1
                return n
        return g

    def _assistant_not_worth_probing(self, policy: DraftLength, batch: int) -> bool:
        """Whether the engine's guesses, pooled over its requests, have been judged often enough
        (a moving average's worth) to say that a periodic probe keeps less than half what it
        costs, even with the first guess's acceptance one standard error up: the back-off's
        test (`DraftLength.probe_every`), put to the engine's evidence instead of one request's."""
        if self.acceptance.judged[0] < self.acceptance.remembered:
            return False
        plain, probing = self._probe_times(policy, batch)
        if not plain or not probing:
            return False
        extra, may_keep = probe_terms(self.acceptance, policy.probe_g, plain, probing)
        return may_keep < extra / 2

    def _probe_every(self, policy: DraftLength, batch: int) -> int:
        return policy.probe_every(*self._probe_times(policy, batch))

    def _probe_times(self, policy: DraftLength, batch: int):
        """`_measured_probe_times`, worked out once per probe length while a step is chosen."""
        if self._memo is None:
            return self._measured_probe_times(policy.probe_g, batch)
        key = ("probe", batch, policy.probe_g)
        if key not in self._memo:
            self._memo[key] = self._measured_probe_times(policy.probe_g, batch)
        return self._memo[key]

    def _measured_probe_times(self, probe_g: int, batch: int):
        """(a plain step's time, a probe step's) at this batch size: a plain step and a probe's
        measured extra over it (`observe_probe`; where none was measured at this size, the
        nearest size's, in proportion to the plain steps' times: probes are rarely timed beside
        other rows, whose requests join, leave and probe), else the step time measured at the
        probe's length, else the line's (`_line`); None while nothing at all is measured at
        this size."""
        plain = self.seconds.get((batch, 1))
        if plain is None:
            return None, None
        positions = probe_g + 1
        measured = [b for b, p in self.probe_extra if p == positions and (b, 1) in self.seconds]
        if measured:
            nearest = min(measured, key=lambda b: (abs(b - batch), b))
            return plain, plain * (1 + self.probe_extra[(nearest, positions)] / self.seconds[(nearest, 1)])
        probing = self.seconds.get((batch, positions))
        return plain, probing if probing is not None else self._line(batch)(positions)

    def _line(self, batch: int):
        """positions -> a step's time at this batch size, for lengths not timed yet (step_lines.line)."""
        return line(self.seconds, batch)

    def _known(self, batch: int):
        return timed_at(self.seconds, batch)

    def observe(self, batch: int, positions: int, seconds: Optional[float]) -> None:
        """A settled step of `batch` rows over `positions` positions took `seconds` of the loop's
        host time (None: not timed, as when it traced)."""
        self.steps += 1
        seconds = self.lockstep.seconds(seconds)
        if seconds is None:
            return
        key = (batch, positions)
        if self.timed.get(key, 0) >= 2:  # (the first timings are a plain mean: none is the figure yet)
            seconds = min(seconds, CLIP * self.seconds[key])
        self.timed[key] = self.timed.get(key, 0) + 1
        # A time taken long ago says less about this moment than the average's weight assumes.
        stale = max(1 - self.decay, 1 - STALE_DECAY ** (self.steps - self.last_timed.get(key, self.steps)))
        self.seconds[key] = average(self.seconds.get(key, 0.0), seconds, self.timed[key], self.decay, stale)
        self.last_timed[key] = self.steps

    def observe_probe(self, batch: int, positions: int, extra: float) -> None:
        """A probe step of `batch` rows over `positions` positions, between plain steps, cost the
        loop `extra` seconds over a plain step (step_clock.py; noise may make one negative)."""
        extra = self.lockstep.seconds(extra)
        key = (batch, positions)
        self.probes_timed[key] = self.probes_timed.get(key, 0) + 1
        self.probe_extra[key] = average(self.probe_extra.get(key, 0.0), extra, self.probes_timed[key], self.decay)

    def table(self) -> Dict[str, float]:
        """The measured step times, 'rows x positions' -> milliseconds (for the bench)."""
        return {f"{b}x{p}": 1000 * t for (b, p), t in sorted(self.seconds.items())}

    def probe_table(self) -> Dict[str, float]:
        """A probe's measured extra over a plain step, 'rows x positions' -> milliseconds."""
        return {f"{b}x{p}": 1000 * t for (b, p), t in sorted(self.probe_extra.items())}

