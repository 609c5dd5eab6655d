"""How much a batch of several rows asks of drafting before it drafts, or tries a length to
time it (draft_lengths.py). A request alone drafts for any gain and tries every untimed
neighbour: its steps are timed as they come. A batch's are not: rows join, leave and probe
around a step, which is timed only between two of its shape, and every row pays for a step."""

from typing import List, Optional

BATCH_MARGIN = 0.05  # in a batch, drafting must be expected this much faster than plain steps
EXPLORE_MARGIN = 0.05  # in a batch, a neighbour is tried only if the line puts it this close to the choice


def best_length(rates: Optional[List[float]], batch: int, shortest: int = 0) -> int:
    """The g of the most tokens per second in `rates` (`DraftLengths.rates`), the shortest on a
    tie, none shorter than `shortest`. A batch of several rows drafts only where that beats
    plain steps by BATCH_MARGIN: near break-even (a compute-bound device, many rows: on this
    project's CPU a guess costs a batch of 8 about what a plain position does) the choice turns
    on the noise in the step times, and every wrong draft is paid by every row."""
    if rates is None:
        return 0
    best, best_rate = 0, -1.0
    for g, rate in enumerate(rates):
        if g == 0 and batch > 1:
            rate *= 1 + BATCH_MARGIN
        if rate > best_rate and g >= shortest:
            best, best_rate = g, rate
    return best


def worth_trying(rates: Optional[List[float]], n: int, g: int) -> bool:
    """Whether length n, next to the chosen g, is worth a try: always for a request alone
    (`rates` None), in a batch only where the line puts it within EXPLORE_MARGIN of g. (8 rows
    of short answers on this project's CPU at a = 0.9: 25 of the first run's 57 steps were
    tries, nearly none of them timed.)"""
    return rates is None or rates[n] >= (1 - EXPLORE_MARGIN) * rates[g]
