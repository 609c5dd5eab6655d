"""A row of the loop (batch.py): one request's decoding, what a synced cycle settles for it, and
its reader.

The row's reports wait in its queue until its reader takes them; the reader gives WAITING when
it has nothing until the next step, and leaves the batch when it is closed (or its row ended)."""

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

import mlx.core as mx

from .cycle import Cycle
from .reports import WAITING, TokenReport
from .sequence import SequenceState


@dataclass
class Row:
    decoder: object  # decoder.py's Decoder: settings, drafter, draft length, statistics
    state: SequenceState
    budget: int  # tokens still to generate
    # Settled reports not taken yet, each with the hidden state the sequence holds while its
    # token is the last (to take the rest back if the reader leaves).
    ready: Deque[Tuple[TokenReport, mx.array]] = field(default_factory=deque)
    hidden: Optional[mx.array] = None  # the state's hidden while the last token taken is its last
    done: bool = False
    error: Optional[BaseException] = None
    joined: float = field(default_factory=time.perf_counter)


class RowReader:
    """A row's reports as they settle, WAITING while the next step has not run; `close` leaves."""

    def __init__(self, batch, row: Row):
        self.batch, self.row = batch, row

    def __iter__(self):
        return self

    def __next__(self):
        row = self.row
        if row.ready:
            report, row.hidden = row.ready.popleft()
            return report
        if row.error is not None:
            error, row.error = row.error, None
            self.close()
            raise error
        if row.done:
            self.close()
            raise StopIteration
        return WAITING

    def close(self) -> None:
        self.batch.leave(self.row)


@dataclass
class Outcome:
    """A synced cycle: its output tokens (cut at a stop token and at the budget), how many of
    its guesses were kept, its report figures, and whether it ended on a stop token."""

    tokens: List[int]
    kept: int
    figures: Dict[str, list]
    stopped: bool


def outcome(cycle: Cycle, budget: int, stop_tokens) -> Outcome:
    """A synced cycle's output: its kept guesses and the token after them, cut at the budget
    and after the first stop token."""
    kept = cycle.kept.item()
    tokens = cycle.tokens.tolist()[: kept + 1][:budget]
    stopped = False
    for i, token in enumerate(tokens):
        if token in stop_tokens:
            tokens, stopped = tokens[: i + 1], True
            break
    return Outcome(tokens, kept, {k: v.tolist() for k, v in cycle.reports.items()}, stopped)
