"""Where each short n-gram of a sequence last occurred, for prompt-lookup guesses.

The index lives with its sequence (`SequenceState.ngrams`) and follows it: it indexes the tokens
added since it last looked (lazily, when a lookup asks), and forgets the positions a sequence
takes back, so each cycle costs time in the tokens that changed, never in the context's length,
and switching between conversations re-indexes nothing.

For each n (MIN_NGRAM..MAX_NGRAM) it keeps, by the n-gram's hash, the latest position e whose n
tokens before it are that n-gram (`head`), and for each position the one before it with the same
hash (`prev`): a chained hash table that can be cut back from the end. Hashes are checked against
the tokens on every hit, so a collision costs a step along the chain, never a wrong guess.
"""

from typing import Dict, List, Sequence

import numpy as np

MIN_NGRAM, MAX_NGRAM = 2, 4
_MULT = 0x9E3779B97F4A7C15  # odd 64-bit multiplier (the golden ratio's)
_MASK = (1 << 64) - 1
_BULK = 64  # positions from which indexing goes through numpy


def _hash(tokens: Sequence[int], end: int, n: int) -> int:
    key = 0
    for t in tokens[end - n : end]:
        key = (key * _MULT + t + 1) & _MASK
    return key


def _hashes(tokens: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """`_hash` for many ends at once (uint64 arithmetic wraps as the mask does)."""
    key = np.zeros(len(ends), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            key = key * np.uint64(_MULT) + tokens[ends - n + i].astype(np.uint64) + np.uint64(1)
    return key


class NgramIndex:
    def __init__(self):
        self.upto = 0  # positions e < upto are indexed
        self.head: Dict[int, Dict[int, int]] = {n: {} for n in range(MIN_NGRAM, MAX_NGRAM + 1)}
        self.prev: Dict[int, List[int]] = {n: [] for n in range(MIN_NGRAM, MAX_NGRAM + 1)}

    def continuation(self, tokens: Sequence[int], g: int) -> List[int]:
        """Up to g guesses for what follows `tokens`: what followed the latest earlier
        occurrence of their longest matching final n-gram (MAX_NGRAM down to MIN_NGRAM tokens),
        copying into the copy itself when the match runs up to the end (as LZ77 does), so that a
        repeating pattern is continued for all g guesses. [] where no n-gram matches."""
        self._index_up_to(tokens)
        length = len(tokens)
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if length <= n:
                continue
            after = self._latest(tokens, n)
            if after >= 0:
                out: List[int] = []
                for j in range(after, after + g):
                    out.append(tokens[j] if j < length else out[j - length])
                return out
        return []

    def _latest(self, tokens: Sequence[int], n: int) -> int:
        """The latest indexed e whose n tokens before it equal the last n, or -1."""
        wanted = list(tokens[-n:])
        e = self.head[n].get(_hash(tokens, len(tokens), n), -1)
        while e >= 0 and list(tokens[e - n : e]) != wanted:  # a hash collision: look further back
            e = self.prev[n][e]
        return e

    def cut(self, tokens: Sequence[int], length: int) -> None:
        """The sequence goes back to its first `length` tokens (`tokens` still holds the rest):
        forget the positions past them."""
        for e in range(self.upto - 1, max(length, 0) - 1, -1):
            for n, prev in self.prev.items():
                if e >= n:
                    key = _hash(tokens, e, n)
                    if prev[e] >= 0:
                        self.head[n][key] = prev[e]
                    else:
                        del self.head[n][key]
                del prev[e]
        self.upto = min(self.upto, max(length, 0))

    def _index_up_to(self, tokens: Sequence[int]) -> None:
        """Index the positions added since the last call: e < len(tokens), each the position
        after an n-gram (the final n-grams have nothing after them yet)."""
        if len(tokens) - self.upto >= _BULK:
            self._index_bulk(tokens)
        for e in range(self.upto, len(tokens)):
            for n, prev in self.prev.items():
                if e < n:
                    prev.append(-1)
                    continue
                key = _hash(tokens, e, n)
                head = self.head[n]
                prev.append(head.get(key, -1))
                head[key] = e
        self.upto = len(tokens)

    def _index_bulk(self, tokens: Sequence[int]) -> None:
        """`_index_up_to` for many positions at once, in numpy: a long prompt is indexed in
        milliseconds. Positions with the same hash are chained in order, the first of each to
        what the index held before."""
        array = np.asarray(tokens, dtype=np.int64)
        ends = np.arange(self.upto, len(tokens))
        for n, prev in self.prev.items():
            head = self.head[n]
            short = ends[ends < n]
            prev.extend([-1] * len(short))
            found = ends[ends >= n]
            if not len(found):
                continue
            keys = _hashes(array, found, n)
            order = np.argsort(keys, kind="stable")
            sorted_keys, sorted_ends = keys[order], found[order]
            first = np.ones(len(order), dtype=bool)
            first[1:] = sorted_keys[1:] != sorted_keys[:-1]
            before = np.empty(len(order), dtype=np.int64)
            before[1:] = sorted_ends[:-1]
            # The first of each hash chains to what the index held before (nothing, for a prompt).
            before[first] = [head.get(k, -1) for k in sorted_keys[first].tolist()] if head else -1
            chained = np.empty(len(order), dtype=np.int64)
            chained[order] = before
            prev.extend(chained.tolist())
            last = np.ones(len(order), dtype=bool)
            last[:-1] = first[1:]
            head.update(zip(sorted_keys[last].tolist(), sorted_ends[last].tolist()))
        self.upto = len(tokens)
