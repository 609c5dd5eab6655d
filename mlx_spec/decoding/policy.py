"""A request's side of the draft length: its acceptance statistics and its probes.

Every request (a row of a batch, or a generation alone: a batch of one) holds a `DraftLength`:
- fixed: g guesses every cycle (MTP off is g = 0), fewer where the budget ends sooner;
- adaptive (the default): the length is chosen each cycle by the engine's one cost model
  (draft_lengths.py) from this request's own acceptance, a_1, a_2, ...: how often guess i is
  kept when the guesses before it were. E(g) = 1 + a1 + a1 a2 + ... is the tokens a cycle with
  g guesses is expected to settle.

A request's acceptance starts from the engine's (every request on it adds to it, but for guesses
copied from its own text), worth a few observations of its own. While an adaptive request drafts
nothing, a short probe now and then notices when guessing pays again: as often as its net cost (its
extra time over a plain cycle, less the tokens its guesses may keep, the first guess counted one
standard error above its estimate: while few observations say, a probe is also worth what it may
find) is about 1% of the time. Near break-even a probe costs next to nothing and comes every few
cycles; where guesses are never kept it costs its whole extra time and comes rarely. A request's
first cycles are a probe too: two guesses, four times as many each time all are kept, until one
misses (so a run where everything is kept reaches its best length in two cycles, whatever the
engine's earlier requests kept). A later probe that keeps everything is followed by a longer one
only where the request's own figures gave that less than a third of a chance (SURPRISING): news
that its content became easier to guess. Where they expected it (near break-even, every other probe
keeps everything), a longer probe would cost its whole draft for a figure the probe just updated,
and the cost model decides from that figure. Where the engine's own guesses, judged often, are not
worth a probe, the first probe is prompt lookup's alone: it asks only whether the request's text
repeats itself, and costs nothing where it does not. In a batch, a step's cost is paid by every
row, however many of them probe in it: rows' probes that are nearly due go out together with one
that is due, and a new row's first probe waits for one (but one lookup alone makes: it costs the
others nothing where it finds nothing), and in sharing a step the rows' probe clocks fall into
step. Each probe in a row that keeps nothing doubles the wait before the next where a probe may
keep less than half what it costs (so one miss near break-even is one observation, not a verdict),
up to MAX_PROBE_INTERVAL plain cycles (a second or two of decoding); a probe that keeps anything
resets it. The loop chooses a cycle's length while the cycle before it runs, so a probe is handed
out once until it settles or is withdrawn (its step was dropped unrun).
"""

from math import prod
from typing import Optional, Tuple

from .acceptance_stats import SLOW_DECAY, AcceptanceStats
from .limits import ADAPTIVE_MAX_G, MAX_DRAFT_TOKENS

MAX_PROBE_INTERVAL = 128  # plain cycles
FIRST_PROBE = 2  # guesses of a request's first cycle
PROBE_OVERHEAD = 0.01  # the share of the time probing may cost
PROBE_WEIGHT = 0.3  # at least this weight for a probe's news (rare news about content that may have changed)
# A periodic probe keeping everything was news (its content changed) below this chance by the
# request's own figures: a noise-free simulation of the bars' order (12-40 seeds, this CPU's and
# a Mac's costs) drafted less where guessing did not pay at 1/4, 1/3 and 1/2 alike (docs/benchmarks.md).
SURPRISING = 1 / 3
MIN_GAIN = 0.05  # expected tokens a row's guesses must add to be worth drafting (draft_lengths.py, retiming.py)
READY, DUE = 1, 2  # a row's probe may go out in a step another row probes in; must go out now


def probe_terms(stats: AcceptanceStats, g: int, plain: float, probing: float) -> Tuple[float, float]:
    """A probe of g guesses in plain cycles: (its extra time over a plain cycle, the tokens its
    guesses may keep, the first guess one standard error above its estimate)."""
    return max(probing / plain - 1, 0.0), stats.optimistic_tokens(g) - 1


class DraftLength:
    """A request's draft length: `fixed` guesses every cycle, or adaptive (fixed=None)."""

    def __init__(self, fixed: Optional[int] = None, max_g: int = ADAPTIVE_MAX_G, first_probe: int = FIRST_PROBE,
                 probe_g: int = 1, decay: float = SLOW_DECAY, prior: Optional[AcceptanceStats] = None):
        """prior: the engine's acceptance, pooled over its requests (draft_lengths.py): this
        request starts from it, and adds to it what it observes."""
        self.fixed = fixed
        self.max_g = max_g if fixed is None else fixed
        known = prior is not None and prior.judged_any
        self.stats = AcceptanceStats.from_prior(prior, decay) if known else AcceptanceStats(MAX_DRAFT_TOKENS, decay)
        self.prior = prior
        self.probe_g = min(probe_g, self.max_g)
        # g of the probe in progress (0: none). The first cycles are one where the engine's
        # acceptance alone would not draft (draft_lengths.py calls `skip_first_probe` where it would): a request's
        # own content may be far easier to guess than the engine's recent ones.
        self.probe = min(first_probe, self.max_g) if fixed is None else 0
        self.first = self.probe > 0  # the first probe is still to come
        self.opening = self.first  # the first probe and the longer ones that follow it
        # The probe due or out is drafted by the drafters that guess for free (prompt lookup)
        # alone, not the assistant: where the engine's assistant guesses are not worth a probe
        # (draft_lengths.py), a request's first probe asks only whether its text repeats itself.
        self.free_only = False
        self.probe_out = False  # handed out, not settled (the next cycle is chosen while this one runs)
        self.plain_streak = 0
        self.cycles = 0  # settled (retiming.py leaves a request's first cycles alone)
        self.backoff = 1  # multiplies the probe interval: doubled by each probe that keeps nothing

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def cap(self, budget: int) -> int:
        """The most guesses a cycle may draft with `budget` tokens to go (it settles up to g + 1)."""
        return max(0, min(self.max_g, budget - 1))

    def probe_wanted(self, every: int, alone: bool) -> int:
        """DUE: a probe is to go out now; READY: it may go out with another row's, sharing its
        step (a probe's cost is its step's, paid by every row of the batch, however many rows
        probe in it); 0: none. `every`: the plain cycles between probes (`probe_every`);
        `alone`: no other row to share a step with. A first probe is due at once alone (a
        request's content may be far easier to guess than the engine's recent ones: repeated
        text for prompt lookup), and so is one the free drafters alone make, else ready until
        `every` plain cycles; a periodic one ready from half its interval; the longer probe
        after one that kept everything due at once."""
        if not self.adaptive or self.probe_out:
            return 0
        if self.first:  # (one the free drafters make alone costs nothing where they find nothing)
            return DUE if alone or self.free_only or self.plain_streak >= every else READY
        if self.probe or self.plain_streak >= every:
            return DUE
        return READY if 2 * self.plain_streak >= every else 0

    def take_probe(self) -> int:
        """The length of the probe to hand out (a periodic one: `probe_g`)."""
        self.probe = self.probe or self.probe_g
        return self.probe

    def handed_out(self, g: int) -> None:
        """The probe went out with g guesses (none: the budget left no room, it is still due)."""
        self.probe_out = self.probe_out or g > 0
        self.first = self.first and g == 0

    def skip_first_probe(self) -> None:
        """The request drafts from its first cycle on the engine's acceptance: no probe first."""
        if self.first:
            self.first, self.opening, self.probe = False, False, 0

    def free_first_probe(self) -> None:
        """The engine's assistant guesses are not worth a probe: the first probe is drafted by the
        free drafters alone (prompt lookup), and drafts nothing where they find nothing."""
        if self.first:
            self.free_only = True

    def probe_every(self, plain: Optional[float], probing: Optional[float]) -> int:
        """Plain cycles between probes, so that probing costs about PROBE_OVERHEAD of the time:
        a probe's net cost (its extra time over a plain cycle, `probing` / `plain`, the engine's
        measured times, None: not measured yet; less the tokens it may keep, `optimistic_tokens`:
        where few observations say, a probe is also worth what it may find; where nothing was
        ever kept, it costs its whole extra time) spread over the cycles in between. Every few
        cycles where a short draft is nearly free, as on a GPU, or where the request is near
        break-even; rarely where a draft step costs nearly a target pass and guesses are not
        kept; at most MAX_PROBE_INTERVAL. The back-off applies where a probe may keep less than
        half what it costs (one miss near break-even is one observation, not a verdict)."""
        if not plain or not probing:
            return min(16 * self.backoff, MAX_PROBE_INTERVAL)
        extra, may_keep = probe_terms(self.stats, self.probe_g, plain, probing)
        net = max(extra - may_keep, 0.0)
        backoff = self.backoff if may_keep < extra / 2 else 1
        return int(min(max(net / PROBE_OVERHEAD, 4) * backoff, MAX_PROBE_INTERVAL))

    def withdraw(self) -> None:
        """The cycle last chosen for was thrown away unrun: a probe handed out for it is handed
        out again."""
        self.probe_out = False

    def observe(self, g: int, kept: int, asked: Optional[int] = None, pooled: bool = True) -> None:
        """A settled cycle: g guesses, the first `kept` of them kept. `asked`: the g it was
        chosen with, when its drafter proposed fewer. A cycle chosen with no guesses leaves a
        probe that is out alone. `pooled`: the engine's acceptance learns it too; not where the
        guesses were copied from the text (prompt lookup): a request whose text repeats itself
        keeps them all, and the next request, on other text, would draft long with the
        assistant from its first cycle on them."""
        asked = g if asked is None else asked
        self.plain_streak = self.plain_streak + 1 if asked == 0 else 0
        self.cycles += 1
        probing = asked > 0 and asked == self.probe
        # The chance, before this news, that every guess would be kept (the module's docstring).
        chance = prod(self.stats.rates(g)) if probing and g else 1.0
        self.stats.observe(g, kept, PROBE_WEIGHT if probing else None)
        if self.prior is not None and pooled:
            self.prior.observe(g, kept)
        if asked > 0 and self.adaptive:
            # A probe that kept everything is followed by a longer one, in the opening or where
            # that was news; a miss ends probing.
            longer = probing and kept == g == asked and g < self.max_g and (self.opening or chance < SURPRISING)
            self.probe = min(4 * g, self.max_g) if longer else 0
            # (a row that drafted beside others before its first probe went out is still opening)
            self.opening = self.opening and (longer if probing else self.first)
            self.probe_out = self.free_only = False
            if probing and g > 0:  # (a drafter that proposed nothing told nothing)
                self.backoff = 2 * self.backoff if kept == 0 else 1

