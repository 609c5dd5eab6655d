"""One sequence being decoded, and going back in it.

A `SequenceState` holds the target's caches, the settled tokens (the last one is not yet in the
caches), the target's hidden state at the last cached position, the marks it can go back to and
its prompt-lookup index. It is the only thing that changes them: the decoding loop, chat
sessions, the prompt cache and the request path call its methods (prompt tokens in, a cycle's
tokens settled, positions trimmed, unsent tokens taken back, a rewind).

While a cycle built ahead is queued (decoding/launch.py), the caches hold positions past the settled
tokens, and their offsets count the most the sequence can reach until the running cycle syncs;
`trim` and `trim_to_settled` bring them back. Nothing is copied or restored.

Going back is the one mechanism behind chat sessions, the prompt cache and the decoding loop:
- full-attention caches (mlx-lm's `KVCache`) can drop any number of their newest positions;
- the sliding-window caches only `max_trim` below the furthest position they reached, since
  older entries have left the window. A mark keeps them as they stood at a chosen point
  (the end of a prompt): a reference to their buffers, no copy until the next write, which
  copies each buffer once (about 10 MB for Gemma 4 E2B; see `Mark.nbytes`).

`rewind(tokens)` goes back to the longest prefix of `tokens` the state can resume from: by
trimming where the sliding caches allow it; else from the latest mark at or a few tokens
after that point, trimmed (Gemma 4's empty thought channel at the end of a prompt, which the
template leaves out when it renders the history); else from the latest mark before it.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx

from ..drafting.ngrams import NgramIndex
from ..errors import PromptStopped
from ..media.items import MediaSpan, chunk_bounds, inside, outside_spans, shared_prefix, spans_before
from ..models.batch_cache import BatchCaches, BatchSlot
from ..models.cache import trim_cache
from ..models.protocol import TargetModel
from .limits import PREFILL_CHUNK, TRIM_ALLOWANCE

MAX_MARKS = 4


@dataclass
class Mark:
    length: int  # settled tokens at the mark; the caches held length - 1 positions
    # cache index -> its snapshot(), for the caches that cannot go back freely (sliding windows,
    # recurrent states: `_held_back`)
    sliding: Dict[int, tuple]
    hidden: Optional[mx.array]
    lowest: int = 0  # the lowest offset those caches, restored, can be trimmed to

    def trimmable_to(self, offset: int) -> bool:
        """Whether the caches, restored, can be trimmed to `offset` positions: a sliding one no
        lower than its trim allowance below the furthest position it had written when the mark
        was taken (beyond the mark when the state had been trimmed back before it), a recurrent
        one only to the mark itself."""
        return self.lowest <= offset

    @property
    def nbytes(self) -> int:
        """What the mark holds once the caches have moved on (their buffers' size)."""
        return sum(a.nbytes for snapshot in self.sliding.values() for a in snapshot[:2] if a is not None)


class SequenceState:
    """The target's caches, the settled tokens and the last hidden state of one sequence."""

    def __init__(self, target: TargetModel, max_trim: int = TRIM_ALLOWANCE):
        self.target = target
        self.max_trim = max_trim
        self.clear()

    def clear(self) -> None:
        self.cache = self.target.make_cache(max_trim=self.max_trim)
        self.tokens: List[int] = []
        self.spans: List[MediaSpan] = []  # media among the tokens, positions in order
        self.hidden: Optional[mx.array] = None
        self.generated = 0  # tokens generated in the current answer, the index of the next uniform
        self.marks: List[Mark] = []
        self.ngrams = NgramIndex()  # where each short n-gram last occurred (prompt lookup)

    def enter(self, batch: BatchCaches) -> None:
        """Lend the caches to a batch (decoding/batch.py): they are copied into a row of its
        storage, and until `leave` this state's caches are that row (its offset and `trim`)."""
        self.cache = [batch.add(self.cache)]

    def leave(self, batch: BatchCaches) -> None:
        """Take the caches back from the batch: the row's K/V, up to its offset, as our own."""
        self.cache = batch.remove(self.cache[0], self.target.make_cache(max_trim=self.max_trim))

    @property
    def in_batch(self) -> bool:
        return isinstance(self.cache[0], BatchSlot)

    def add_prompt(self, tokens: List[int], chunk: int = PREFILL_CHUNK, spans: Sequence[MediaSpan] = (),
                   stop: Optional[Callable[[], bool]] = None) -> int:
        """Append prompt tokens: the last settled token and all the new ones but the last go
        through the target now (in chunks of `chunk`); returns how many went through. `spans`:
        the media of the whole prompt (positions from its start); those among the new tokens
        put their embeddings at their soft tokens. The tokens generated after them are a new
        answer (its uniforms start again at index 0). If the target fails on them, the state is
        emptied: its caches may be half written.

        `stop`, asked between chunks: when it says so, the state keeps the tokens that went
        through (a prefix of the prompt, consistent, resumable) and PromptStopped is raised."""
        first = len(self.tokens)
        new_spans = [s for s in spans if s.end > first]
        if any(s.start < first or s.end >= first + len(tokens) for s in new_spans):
            raise ValueError("a media item must lie wholly among the new prompt tokens, before the last")
        to_process = self.tokens[-1:] + list(tokens[:-1])
        start = self.cached  # the position of to_process[0]
        pieces = list(chunk_bounds(len(to_process), chunk, new_spans, start)) if stop else [(0, len(to_process))]
        feeding = [s.embedded_once() for s in new_spans]  # an audio clip may go through in chunks
        for lo, hi in pieces if to_process else []:
            if lo > 0 and stop():
                kept = lo + (1 if not first else 0)  # the last kept token is not yet through, as always
                # An item cut there is kept with its tokens: no prompt resumes inside it (outside_spans).
                self._keep(tokens[:kept], [s for s in new_spans if s.start < first + kept])
                raise PromptStopped(lo)
            try:
                hidden = self.target.prefill(mx.array([to_process[lo:hi]]), self.cache, chunk,
                                             inside(feeding, start + lo, start + hi), start + lo)
                mx.eval(hidden)
            except BaseException:
                self.clear()
                raise
            self.hidden = hidden
        self._keep(tokens, new_spans)
        return len(to_process)

    def _keep(self, tokens: List[int], spans: Sequence[MediaSpan]) -> None:
        self.tokens.extend(tokens)
        self.spans.extend(spans)
        self.generated = 0

    def settle(self, tokens: List[int], hidden: mx.array) -> None:
        """A cycle's output tokens are settled; `hidden` is the target's hidden state at the
        position before the last of them. (The caches must already hold all but that last.)"""
        self.tokens.extend(tokens)
        self.generated += len(tokens)
        self.hidden = hidden

    def trim(self, n: int) -> None:
        """Drop the newest `n` positions of every cache (none when n <= 0)."""
        trim_cache(self.cache, n)

    def trim_to_settled(self) -> None:
        """Drop every cached position past the settled tokens (a cycle queued, then not kept)."""
        self.trim(self.cached - (len(self.tokens) - 1))

    def take_back(self, n: int, hidden: Optional[mx.array]) -> None:
        """Take back the last `n` settled tokens (never handed to the caller); `hidden` is the
        target's hidden state before the token that is last now."""
        if n <= 0:
            return
        self.ngrams.cut(self.tokens, len(self.tokens) - n)
        del self.tokens[-n:]
        self.generated -= n
        self.hidden = hidden

    @property
    def takeable(self) -> int:
        """How many of the last settled tokens `take_back` may take, the caches then trimmed to
        the settled ones: in a batch, its row goes back no further than its trim allowance."""
        if not self.in_batch:
            return self.generated
        return self.cache[0].trim_room - (self.cached - (len(self.tokens) - 1))  # (less a queued cycle's)

    @property
    def cached(self) -> int:
        return self.cache[0].offset

    @property
    def nbytes(self) -> int:
        """Memory held: the caches and what the marks keep alive."""
        return sum(c.nbytes for c in self.cache) + sum(cp.nbytes for cp in self.marks)

    def _held_back(self):
        """(index, cache) of the caches that cannot drop any number of their newest positions:
        sliding windows (their oldest have left) and recurrent states (models/qwen3_5)."""
        return [(i, c) for i, c in enumerate(self.cache) if hasattr(c, "snapshot")]

    def mark(self) -> None:
        """Remember this point (every token settled) so that `rewind` can come back to it."""
        if not self.tokens or self.cached != len(self.tokens) - 1:
            raise ValueError("a mark needs a settled state: every token but the last in the caches")
        if self.marks and self.marks[-1].length == len(self.tokens):
            self.marks.pop()
        held = self._held_back()
        lowest = max((c.lowest_reachable() for _, c in held), default=0)
        self.marks.append(Mark(len(self.tokens), {i: c.snapshot() for i, c in held}, self.hidden, lowest))
        del self.marks[:-MAX_MARKS]

    def resumable(self, tokens: Sequence[int], spans: Sequence[MediaSpan] = ()) -> int:
        """How many of `tokens` `rewind(tokens, spans)` would keep (nothing changes)."""
        keep = self._keepable(tokens, spans)
        return keep if keep == len(self.tokens) else self._resume_point(keep)[0]

    def _keepable(self, tokens: Sequence[int], spans: Sequence[MediaSpan]) -> int:
        """The most of a prompt this state holds: the same tokens and media, not its last token,
        never ending inside a media item."""
        common = shared_prefix(self.tokens, self.spans, tokens, spans)
        return outside_spans(min(common, len(tokens) - 1), self.spans)

    def rewind(self, tokens: Sequence[int], spans: Sequence[MediaSpan] = ()) -> int:
        """Go back to the longest prefix of `tokens` (with media `spans`) this state can resume
        from, and return its length. The last of `tokens` is never kept: it must go through the
        target again, for the logits of what follows."""
        keep = self._keepable(tokens, spans)
        if keep == len(self.tokens):
            return keep
        length, mark = self._resume_point(keep)
        if length == 0:
            self.clear()
            return 0
        if mark is not None:
            for i, c in enumerate(self.cache):
                if i in mark.sliding:
                    c.restore(mark.sliding[i])
                else:  # full attention: its older positions never changed
                    c.trim(c.offset - (mark.length - 1))
            self.hidden = mark.hidden
        if self.cached > length - 1:
            self.trim(self.cached - (length - 1))
            self.hidden = None  # unknown here; the next tokens added give it again
        self.ngrams.cut(self.tokens, length)
        del self.tokens[length:]
        self.spans = spans_before(self.spans, length)
        self.marks = [cp for cp in self.marks if cp.length <= length]
        return length

    def _resume_point(self, keep: int):
        """(length, mark or None): the longest prefix of at most `keep` tokens to go
        back to, and the mark to restore first."""
        target = keep - 1  # cache positions to hold
        if all(c.trimmable_to(target) for _, c in self._held_back()):
            return keep, None
        for cp in reversed(self.marks):
            if cp.length - 1 >= target and cp.trimmable_to(target):
                return keep, cp
        before = [cp for cp in self.marks if cp.length <= keep]
        return (before[-1].length, before[-1]) if before else (0, None)
