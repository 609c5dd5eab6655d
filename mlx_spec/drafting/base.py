"""What a drafter is: its inputs (`DraftContext`), its output (`Draft`), and the base class that
declares what the loop may do with it.

A drafter is called once per cycle, after the target's caches were cut back to the settled
tokens, and returns up to g guesses for the tokens that follow. Its guesses may stay lazy MLX
arrays: the engine verifies them in the same graph, so drafting costs no host synchronisation
of its own.

A drafter that samples its guesses returns their distributions `q` (over the whole vocabulary);
the engine then keeps guesses with the min(1, p/q) rule. A drafter that returns no `q` is treated
as deterministic, and guesses are kept while they match the target's own draw. Both are exact.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import mlx.core as mx

from ..errors import SettingsError
from ..models.protocol import SharedKV
from ..sampling.settings import SamplingSettings
from .ngrams import NgramIndex
from .pieces import HostWork


@dataclass
class DraftContext:
    tokens: List[int]  # every settled token, prompt included; the last is not yet in the caches
    last_token: mx.array  # [1, 1], the last settled token (may be lazy)
    hidden: mx.array  # [1, 1, H], the target's final hidden state at the position before it
    kv: Dict[str, SharedKV]  # the target's K/V (see Target.drafter_buffers)
    settings: SamplingSettings
    uniforms: mx.array  # [g, 2], for drafters that sample (see sampling.inverse_cdf)
    # For a cycle drafted ahead of the host: how many tokens the running cycle settles after
    # `tokens` (a device array; 1 after a cycle without guesses). Only drafters that declare
    # `drafts_ahead` see it set; they read the position as `device_position`, and the K/V
    # ranges may be device arrays too.
    ahead: Union[None, int, mx.array] = None
    # The sequence's n-gram index (see ngrams.py), for drafters that copy; a fresh one for a
    # context made by hand.
    ngrams: NgramIndex = field(default_factory=NgramIndex)

    @property
    def position(self) -> int:
        """Position of the last settled token (on the host: a cycle drafted ahead has none)."""
        if self.ahead is not None:
            raise ValueError("the position of a cycle drafted ahead is on the device: read device_position")
        return len(self.tokens) - 1

    @property
    def device_position(self) -> mx.array:
        """Position of the last settled token as an int32 array (lazy when drafted ahead)."""
        if not isinstance(self.ahead, mx.array):
            return mx.array(len(self.tokens) - 1 + (self.ahead or 0), mx.int32)
        return (self.ahead + (len(self.tokens) - 1)).astype(mx.int32)


@dataclass
class Draft:
    tokens: mx.array  # [n] int32, n <= g: a drafter may propose fewer guesses than asked
    q: Optional[mx.array] = None  # [n, V] when the guesses were sampled from q
    source: str = "drafter"  # where the guesses came from, for the statistics
    # Each step's output, in order, for drafters that guess step by step: the cycle is launched
    # a step at a time (see decoding/launch.py).
    steps: List[mx.array] = field(default_factory=list)
    # Copied from the text (prompt lookup): they say whether this text repeats itself, not how a
    # drafter guesses, so the engine's pooled acceptance, where a new request starts, leaves
    # them out (decoding/policy.py).
    copied: bool = False


class Drafter(ABC):
    """A source of guesses. Subclasses implement `draft`, and declare what they allow:

    - `drafts_ahead` (default False): the drafter reads only what is on the device (the last
      token, the hidden state, the K/V, `device_position`), never the values of
      `context.tokens`, so the loop may ask it for a cycle before the running cycle's tokens
      reach the host (`context.ahead` is then set). Off by default: a drafter that reads the
      tokens and were drafted ahead would see stale ones and lose guesses silently.
    - `draft_steps`: a drafter that guesses step by step yields after each step, so the loop can
      build its cycle between the stages of the running cycle's launch (decoding/launch.py).
    """

    drafts_ahead = False
    source = "drafter"  # the name its guesses are counted under in the statistics

    @abstractmethod
    def draft(self, context: DraftContext, g: int) -> Draft:
        """Up to g guesses for the tokens after `context.tokens`."""

    def draft_steps(self, context: DraftContext, g: int) -> HostWork:
        """`draft` as host work, yielding after each step; by default all in one piece."""
        return self.draft(context, g)
        yield  # unreachable: it makes this a generator, run as one piece

    def for_ahead(self, last_source: str) -> Optional["Drafter"]:
        """The drafter for a cycle built before the running cycle's tokens reach the host
        (`last_source`: who guessed the running cycle's); None: the cycle waits for them."""
        return self if self.drafts_ahead else None

    def begin(self, sequence) -> None:
        """A generation starts on `sequence` (a SequenceState; its `tokens` hold the prompt and
        all settled before). A drafter that keeps state of its own keys it on the sequence:
        several sequences may alternate (chat sessions, the server's conversations), and tokens
        settled but never handed over are taken back between generations."""

    def accept(self, sequence, tokens: List[int]) -> None:
        """`tokens` were settled on `sequence`, in order (its `tokens` now end with them)."""


class Custom(Drafter):
    """Any object with `draft(context, g)`, as a Drafter with the safe defaults: it is never
    asked to draft ahead, since nothing says it does not read the tokens."""

    def __init__(self, inner):
        self.inner = inner

    def draft(self, context: DraftContext, g: int) -> Draft:
        draft = self.inner.draft(context, g)
        if not isinstance(draft, Draft):
            raise SettingsError(f"drafter {self.inner!r}: draft(context, g) must return a mlx_spec.drafting.Draft "
                                f"(tokens: an int32 mx.array of up to g ids), got {type(draft).__name__}")
        # (their shapes are checked where the cycle takes them: decoding/cycle.py)
        if not isinstance(draft.tokens, mx.array) or not isinstance(draft.q, (mx.array, type(None))):
            wrong = "tokens" if not isinstance(draft.tokens, mx.array) else "q"
            raise SettingsError(f"drafter {self.inner!r}: a Draft's {wrong} must be an mx.array, "
                                f"got {type(getattr(draft, wrong)).__name__}")
        return draft

    def begin(self, sequence) -> None:
        if callable(getattr(self.inner, "begin", None)):
            self.inner.begin(sequence)

    def accept(self, sequence, tokens: List[int]) -> None:
        if callable(getattr(self.inner, "accept", None)):
            self.inner.accept(sequence, tokens)


def as_drafter(drafter) -> Optional[Drafter]:
    """A Drafter for `drafter` (None stays None); an object without draft() is a SettingsError."""
    if drafter is None or isinstance(drafter, Drafter):
        return drafter
    if not callable(getattr(drafter, "draft", None)):
        raise SettingsError(f"drafter {drafter!r} has no draft(context, g) method")
    return Custom(drafter)
