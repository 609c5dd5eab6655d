"""One image or audio clip in a prompt, and where its soft tokens sit.

A `MediaItem` is what a media encoder made of one input: the arrays its tower or embedder reads,
how many soft tokens it takes in the prompt, and a digest of those arrays. The digest is the
item's identity: a sequence resumes from an earlier prompt only where the tokens AND the media
at each position are the same, so the same text with another image never reuses the first
image's keys and values (the soft tokens themselves are one repeated id).

A `MediaSpan` places an item in a token sequence: its soft tokens run from `start` to `end`,
between the begin and end markers the processor writes around them.
"""

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, NamedTuple, Sequence, Tuple

import mlx.core as mx
import numpy as np

IMAGE, AUDIO = "image", "audio"


@dataclass(frozen=True)
class MediaItem:
    kind: str  # IMAGE or AUDIO
    tokens: int  # soft tokens in the prompt
    digest: str  # sha256 of the arrays below
    arrays: Tuple[np.ndarray, ...] = field(compare=False, repr=False)  # what the encoder reads

    @staticmethod
    def of(kind: str, tokens: int, *arrays: np.ndarray) -> "MediaItem":
        h = hashlib.sha256(kind.encode())
        for a in arrays:
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
        return MediaItem(kind, tokens, h.hexdigest(), tuple(arrays))


@dataclass(frozen=True)
class MediaSpan:
    start: int  # position of the first soft token
    item: MediaItem
    embed: Callable[[], mx.array] = field(compare=False, repr=False)  # [tokens, hidden], run on demand

    @property
    def end(self) -> int:
        return self.start + self.item.tokens

    @property
    def key(self) -> Tuple[int, str]:
        return self.start, self.item.digest

    @property
    def whole(self) -> bool:
        """Whether its soft tokens go through the target together: an image's may attend to each
        other both ways; an audio clip's are causal, and go through in chunks like text."""
        return self.item.kind == IMAGE

    def piece(self, lo: int, hi: int) -> "MediaSpan":
        """Its soft tokens within absolute positions [lo, hi), as a span of their own."""
        a, b = max(lo, self.start) - self.start, min(hi, self.end) - self.start
        if (a, b) == (0, self.item.tokens):
            return self
        item = MediaItem(self.item.kind, b - a, f"{self.item.digest}[{a}:{b}]", ())
        return MediaSpan(self.start + a, item, lambda: self.embed()[a:b])

    def embedded_once(self) -> "MediaSpan":
        """The span, its encoder run at most once however many chunks read it."""
        done: List[mx.array] = []

        def embed() -> mx.array:
            if not done:
                features = self.embed()
                if features.shape[0] != self.item.tokens:  # (each piece's slice would hide it)
                    raise ValueError(f"the {self.item.kind} encoder gave {tuple(features.shape)} for "
                                     f"{self.item.tokens} soft tokens")
                done.append(features)
            return done[0]

        return MediaSpan(self.start, self.item, embed)


class Prepared(NamedTuple):
    """A prompt as the target reads it: token ids, and the media among them."""

    tokens: List[int]
    spans: List[MediaSpan]


def shared_prefix(tokens_a: Sequence[int], spans_a: Sequence[MediaSpan],
                  tokens_b: Sequence[int], spans_b: Sequence[MediaSpan]) -> int:
    """How many leading positions two prompts share: the same token ids, and the same media
    item at every soft token among them."""
    n = min(len(tokens_a), len(tokens_b))
    for i in range(n):
        if tokens_a[i] != tokens_b[i]:
            n = i
            break
    for spans, others in ((spans_a, spans_b), (spans_b, spans_a)):
        keys = {s.key for s in others}
        for span in spans:
            if span.start < n and span.key not in keys:
                n = span.start
    return n


def outside_spans(length: int, spans: Sequence[MediaSpan]) -> int:
    """The longest prefix of at most `length` positions whose last position is not a soft token:
    a sequence resumed there processes its last position again as a token, and an item's soft
    tokens go through the target together (an image's attend to each other both ways)."""
    for span in spans:
        if span.start <= length - 1 < span.end:
            return span.start
    return length


def spans_before(spans: List[MediaSpan], length: int) -> List[MediaSpan]:
    """The spans that lie wholly in the first `length` positions."""
    return [s for s in spans if s.end <= length]


def chunk_bounds(length: int, chunk: int, spans: Sequence[MediaSpan], start: int) -> Iterator[Tuple[int, int]]:
    """[lo, hi) ranges of at most `chunk` positions covering `length` positions from position
    `start`, never cutting an image (a chunk that would end inside one runs to its end). Audio
    is cut like text, so that a long clip's chunk holds no more K/V than a text chunk."""
    lo = 0
    while lo < length:
        hi = min(lo + chunk, length)
        for span in spans:
            if span.whole and span.start - start < hi < span.end - start:
                hi = span.end - start
        yield lo, hi
        lo = hi


def inside(spans: Sequence[MediaSpan], lo: int, hi: int) -> List[MediaSpan]:
    """The spans within absolute positions [lo, hi), an audio clip's cut to its soft tokens
    there; an image cut by that range is an error (a caller resumed a sequence inside one)."""
    found = []
    for span in spans:
        if span.end <= lo or span.start >= hi:
            continue
        if span.whole and (span.start < lo or span.end > hi):
            raise ValueError(f"positions {lo}..{hi} cut the {span.item.kind} at {span.start}..{span.end}")
        found.append(span.piece(lo, hi))
    return found
