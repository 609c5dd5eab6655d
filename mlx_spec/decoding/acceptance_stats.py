"""A request's acceptance statistics: how often each guess position is kept, as the draft
length's choices read them (policy.py holds the request's draft length, draft_lengths.py the
engine's cost model, which also pools these over its requests)."""

from typing import List, Optional

# A request's figures are moving averages over about 25 of its own judgements (decay 0.96). Over
# 12 (0.92), five kept first guesses in a row (at a = 0.7, a chance of 0.17 from any cycle) lift a
# settled 0.7 to 0.80, every deeper position not judged yet counts as that, and the choice drafted
# long on it: on the tiny checkpoint at a = 0.7, 0.96 ran faster than 0.92 in 47 of 70 paired
# rounds (docs/benchmarks.md, stop 69). What 12 did quicker is kept: a request's first dozen
# judgements of a position move off the engine's figure at 12's pace, and content that changes is
# followed at it. A quicker average (0.92) runs beside each figure; where the two part by more
# than CHANGE_Z standard deviations of their difference on unchanged content (on unchanged
# content, once in 900 to 1,800 judgements), the content changed, and the quicker one is the
# figure again until the request has judged a dozen of the new content's guesses.
SLOW_DECAY, QUICK_DECAY = 0.96, 0.92
CHANGE_Z = 3.0


def _difference_sd(slow: float, quick: float) -> float:
    """The standard deviation of (quick - slow) moving averages of the same coin flips, per unit
    of the flips' own: both average the same news, so their difference is far steadier than
    either."""
    ls, lq = 1 - slow, 1 - quick
    return (lq / (2 - lq) + ls / (2 - ls) - 2 * lq * ls / (1 - quick * slow)) ** 0.5


class AcceptanceStats:
    """a_i: how often guess i was kept when every guess before it was, as moving averages
    (a plain mean over the first observations), each with a quicker one beside it that tells
    when the content changed (SLOW_DECAY, QUICK_DECAY: the module's head).

    A guess position never judged is assumed to do as well as the deepest one that was (0.5
    before any), so longer drafts get tried when short ones all pass.

    A request's statistics start from a prior (`from_prior`): the engine's own, pooled over every
    request on it, worth PRIOR_WEIGHT observations of each position it has judged, so that one
    unlucky first cycle does not set a request's acceptance to nothing (and stop its drafting
    for a hundred cycles), and a request on an engine whose requests keep their guesses drafts
    long from its first cycle. A position only the prior has judged counts as no worse than the
    deepest one this request has judged itself: the engine's figure for it may be stale (its
    requests drafted short) or another content's, and a request that keeps every short draft
    must still try a longer one to find out. A position the prior has not judged for longer than
    its first guess's moving average remembers (its requests drafted shorter since, or kept no
    first guesses) is not handed over at all: it is another content's figure (a run that kept
    everything, long ago), and counts as unjudged, as good as the deepest position judged. The
    request's own figures are held alike: a deeper position's first news is weighed against what
    was assumed for it, and one it has not judged lately is no worse than its deepest judged
    lately, so that no early miss keeps it drafting short where its guesses are kept."""

    PRIOR_WEIGHT = 4

    def __init__(self, max_g: int, decay: float = SLOW_DECAY, quick_decay: Optional[float] = QUICK_DECAY):
        """quick_decay: the quicker average beside each figure that tells when the content
        changed (None: none, the figure alone; the engine's pooled figures)."""
        self.decay = decay
        self.quick_decay = quick_decay if quick_decay is not None and quick_decay < decay else None
        self.change_at = CHANGE_Z * _difference_sd(decay, self.quick_decay) if self.quick_decay else None
        # Judgements of its own a position's figure waits for before it is the slower average's.
        self.quick_horizon = 1 / (1 - self.quick_decay) if self.quick_decay else None
        self.acceptance: List[float] = [0.5] * max_g
        # Beside the figure: the quicker average (with the prior's judgements) and the slower
        # one of the request's own judgements since the figure's start or its content's last change.
        self.quick: List[float] = [0.5] * max_g
        self.slow: List[float] = [0.5] * max_g
        self.steady: List[int] = [0] * max_g
        self.judged: List[int] = [0] * max_g
        self.own: List[int] = [0] * max_g  # judged by this request itself (not the prior)
        self.prior_at: List[float] = [0.0] * max_g  # the prior's figure at each position (0: none)
        # First guesses judged since each position was last judged: how stale its figure is.
        self.age: List[int] = [0] * max_g

    @property
    def remembered(self) -> float:
        """Observations a moving average's worth: how many its figure mostly rests on."""
        return 1 / (1 - self.decay)

    @classmethod
    def from_prior(cls, prior: "AcceptanceStats", decay: float = SLOW_DECAY,
                   quick_decay: Optional[float] = QUICK_DECAY) -> "AcceptanceStats":
        stats = cls(len(prior.acceptance), decay, quick_decay)
        for i, n in enumerate(prior.judged):
            if n and prior.age[i] <= prior.remembered:
                stats.acceptance[i], stats.judged[i] = prior.acceptance[i], min(n, cls.PRIOR_WEIGHT)
                stats.quick[i] = prior.acceptance[i]
                stats.prior_at[i] = prior.acceptance[i]
        return stats

    @property
    def judged_any(self) -> bool:
        return any(self.judged)

    def observe(self, g: int, kept: int, weight: Optional[float] = None) -> None:
        """A cycle with g guesses kept its first `kept`. `weight`: at least this much weight for
        the news. A deeper position judged for the first time, or for the first time in a while
        (`_stale`), starts from the figure `rates` assumed for it, worth PRIOR_WEIGHT
        observations, as a prior's figure is: one miss at its first judgement does not set it to
        nothing (a request that keeps its first guesses 9 in 10 times drafted one guess a cycle
        for the rest of its answer after one), and early misses do not hold it back once the
        guesses before it are kept again."""
        judged = min(g, kept + 1, len(self.acceptance))
        if judged:  # (a cycle without guesses judges nothing, and ages nothing)
            for i in range(judged, len(self.acceptance)):
                self.age[i] += 1
        for i in range(judged):  # guess i was judged: all before it were kept
            if i and (not self.judged[i] or self._stale(i)):  # its first news in a while: weighed
                # against the figure assumed for it (its old one is another content's)
                self.acceptance[i], self.judged[i] = self.rates(i + 1)[i], self.PRIOR_WEIGHT
                self.quick[i], self.steady[i] = self.acceptance[i], 0
            self.age[i] = 0
            self.judged[i] += 1
            self.own[i] += 1
            self._average(i, 1.0 if i < kept else 0.0, weight)

    def _average(self, i: int, news: float, weight: Optional[float]) -> None:
        """Position i's news. The quicker average carries the prior (or the figure assumed at a
        first judgement) and is the figure until the request has judged the position a quicker
        average's worth of times itself (about 12); from there the figure is the slower average
        of the request's own judgements. Where the two part by more than chance on unchanged
        content allows, the content changed: the figure is the quicker one's again, and the
        request's own judgements start again (what came before the change says nothing of it)."""
        if self.quick_decay is None:
            self.acceptance[i] = average(self.acceptance[i], news, self.judged[i], self.decay, weight)
            return
        self.quick[i] = average(self.quick[i], news, self.judged[i], self.quick_decay, weight)
        self.steady[i] += 1
        self.slow[i] = average(self.slow[i], news, self.steady[i], self.decay, weight)
        if self.steady[i] < self.quick_horizon:
            self.acceptance[i] = self.quick[i]
            return
        if self.steady[i] - 1 < self.quick_horizon:
            # The quicker one leaves the engine's figure behind: from here both say what this
            # request's own judgements say, and only a change of its content parts them.
            self.quick[i] = self.slow[i]
        spread = max(self.slow[i] * (1 - self.slow[i]), 0.05) ** 0.5
        if abs(self.quick[i] - self.slow[i]) > self.change_at * spread:
            # (the quicker one, worth a prior's few judgements, moves as a plain mean's first
            # observations do: it leaves the old content behind faster still)
            self.acceptance[i], self.steady[i] = self.quick[i], 0
            self.judged[i] = min(self.judged[i], self.PRIOR_WEIGHT)
        else:
            self.acceptance[i] = self.slow[i]

    def _stale(self, i: int) -> bool:
        """Whether this request judged position i itself, but not for a moving average's worth of
        first guesses (it drafted shorter since)."""
        return self.own[i] > 0 and self.age[i] > self.remembered

    def rates(self, g: int) -> List[float]:
        """a_1 .. a_g as the predictions use them. Unjudged positions: as the deepest judged. A
        position only the prior judged: where this request does at least as well as the prior at
        its own deepest position, no worse than that (the prior's deeper figures may be stale or
        another content's: the request tries a longer draft and finds out); where it does worse,
        the prior's figure scaled down alike (an engine whose requests kept everything must not
        make a request that keeps nothing draft long until it has judged every depth itself). A
        position this request has not judged for a moving average's worth of first guesses (it
        drafted shorter since): no worse than the deepest one it judged lately (an early run of
        misses there must not keep it from drafting that deep again where its shorter guesses
        are kept)."""
        out, last, own_last, scale = [], 0.5, None, 1.0
        for i in range(g):
            if self.own[i] and not self._stale(i):
                last = own_last = self.acceptance[i]
                scale = own_last / self.prior_at[i] if self.prior_at[i] > own_last else 1.0
            elif self.judged[i]:
                if own_last is None:
                    last = self.acceptance[i]
                elif self.own[i] or scale >= 1:
                    last = max(self.acceptance[i], own_last)
                else:
                    last = self.acceptance[i] * scale
            out.append(last)
        return out

    def expected_tokens(self, g: int) -> float:
        """E(g) = 1 + a1 + a1 a2 + ...: the tokens a cycle with g guesses is expected to settle."""
        return self.expected_curve(g)[g]

    def optimistic_tokens(self, g: int) -> float:
        """E(g) with a_1 one standard error above its estimate (from the observations it rests on,
        at most a moving average's worth): what a probe may find, while few observations say."""
        rates = self.rates(g)
        count = min(self.judged[0], self.remembered)
        if rates and count:
            rates[0] = min(1.0, rates[0] + (rates[0] * (1 - rates[0]) / count) ** 0.5)
        return curve(rates)[-1]

    def expected_curve(self, limit: int) -> List[float]:
        """[E(0), E(1), ..., E(limit)] in one pass."""
        return curve(self.rates(limit))


def curve(rates: List[float]) -> List[float]:
    """[E(0), E(1), ...] for acceptances a_1, a_2, ...: E(g) = 1 + a1 + a1 a2 + ..."""
    out, total, run = [1.0], 1.0, 1.0
    for a in rates:
        run *= a
        total += run
        out.append(total)
    return out


def average(old: float, new: float, count: int, decay: float, weight: Optional[float] = None) -> float:
    """A plain mean over the first observations, a moving average after them."""
    weight = max(1.0 / count, weight or 1 - decay)
    return (1 - weight) * old + weight * new
