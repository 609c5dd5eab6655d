"""The drafter protocol and the MTP assistant drafter.

A drafter is any object with `draft(context, g) -> Draft`. It is called once per cycle, after
the target's caches were cut back to the settled tokens, and returns g guesses for the tokens
that follow `context.tokens`. Its guesses may stay lazy MLX arrays: the engine verifies them in
the same graph, so drafting costs no host synchronisation of its own.

A drafter that guesses step by step may also offer `draft_pieces(context, g)`: a generator that
yields after each step and returns the Draft, with each step's output in `Draft.steps`. The loop
then builds it a step at a time between the stages of the running cycle's launch (launch.py),
and launches its cycle a step at a time; `draft` must give the same Draft.

A drafter that samples its guesses returns their distributions `q` (over the whole vocabulary);
the engine then keeps guesses with the min(1, p/q) rule. A drafter that returns no `q` is treated
as deterministic, and guesses are kept while they match the target's own draw. Both are exact.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Tuple, runtime_checkable

import mlx.core as mx

from .assistant import Assistant
from .pieces import HostWork, run_through
from .sampling import SamplingSettings, distribution
from .gemma4 import FULL, SLIDING
from .ngrams import NgramIndex
from .target import SharedKV, Target
from .traces import TraceCache


@dataclass
class DraftContext:
    tokens: List[int]  # every settled token, prompt included; the last is not yet in the caches
    last_token: mx.array  # [1, 1], the last settled token (may be lazy)
    hidden: mx.array  # [1, 1, H], the target's final hidden state at the position before it
    kv: Dict[str, SharedKV]  # the target's K/V (see Target.drafter_buffers)
    settings: SamplingSettings
    uniforms: mx.array  # [g, 2], for drafters that sample (see sampling.inverse_cdf)
    # Settled tokens, when the last of them are still on the device (a cycle built ahead):
    # `tokens` then holds only the first ones. Drafters that read token values (reads_tokens)
    # are never asked to draft ahead.
    length: Optional[int] = None
    # The sequence's n-gram index (see ngrams.py), for drafters that copy; a fresh one for a
    # context made by hand.
    ngrams: NgramIndex = field(default_factory=NgramIndex)

    @property
    def shared_kv(self) -> Dict[str, Tuple[mx.array, mx.array]]:
        """The K/V to read, sliced out of the buffers (see Target.drafter_kv)."""
        return {kind: kv.view() for kind, kv in self.kv.items()}

    @property
    def position(self) -> int:
        """Position of the last settled token."""
        return (len(self.tokens) if self.length is None else self.length) - 1


@dataclass
class Draft:
    tokens: mx.array  # [n] int32, n <= g: a drafter may propose fewer guesses than asked
    q: Optional[mx.array] = None  # [n, V] when the guesses were sampled from q
    source: str = "drafter"  # where the guesses came from, for the statistics
    # Each step's output, in order, for drafters that guess step by step: the cycle is launched
    # a step at a time (see pieces.py).
    steps: List[mx.array] = field(default_factory=list)


@runtime_checkable
class Drafter(Protocol):
    def draft(self, context: DraftContext, g: int) -> Draft: ...


def draft_in_pieces(drafter: Drafter, context: DraftContext, g: int) -> HostWork:
    """The drafter's work a step per piece where it offers `draft_pieces(context, g)` (a
    generator that yields after each step and returns the Draft), else in one piece."""
    pieces = getattr(drafter, "draft_pieces", None)
    if pieces is None:
        return drafter.draft(context, g)
    return (yield from pieces(context, g))


def ahead_drafter(drafter: Optional[Drafter], last_source: str) -> Optional[Drafter]:
    """The drafter for a cycle built ahead, before the last settled tokens reach the host: the
    drafter itself unless it reads token values (`reads_tokens = True`); then what its
    `ahead_drafter(last_source)` offers, or None (the cycle waits for the tokens)."""
    if drafter is None or not getattr(drafter, "reads_tokens", False):
        return drafter
    offer = getattr(drafter, "ahead_drafter", None)
    return offer(last_source) if offer is not None else None


class MTPDrafter:
    """Gemma 4's MTP assistant: g steps at a constant position, reading the target's K/V.

    sample=False (default): argmax guesses, never building full-vocabulary logits.
    sample=True: at temperature > 0, guesses are drawn from the drafter's own distribution
    under the same settings, and their q is returned for the ratio rule.
    position_offset: 0 is transformers' convention (the last settled token's position);
    -1 is vLLM's and mlx-vlm's.
    """

    def __init__(self, assistant: Assistant, target: Target, sample: bool = False, position_offset: int = 0):
        self.assistant = assistant
        self.target = target
        self.sample = sample
        self.position_offset = position_offset
        self.traces = TraceCache()  # compiled draft steps, by sampling settings and K/V buffer shapes

    def draft(self, context: DraftContext, g: int) -> Draft:
        return run_through(self.draft_pieces(context, g))

    def draft_pieces(self, context: DraftContext, g: int) -> HostWork:
        """`draft`, yielding after each step."""
        sampled = self.sample and not context.settings.greedy
        token, hidden = context.last_token, context.hidden
        position = mx.array(context.position + self.position_offset)
        # The K/V stay the same for every step of the round: their masks are built once.
        sliding, full = context.kv[SLIDING].last(self.assistant.sliding_span), context.kv[FULL]
        kv = (sliding.keys, sliding.values, sliding.mask(), full.keys, full.values, full.mask())
        step = self._step(context.settings if sampled else None, (sliding.keys.shape, full.keys.shape))
        guesses, qs = [], []
        for i in range(g):
            if sampled:
                token, hidden, q = step(token, hidden, *kv, position, context.uniforms[i])
                qs.append(q)
            else:
                token, hidden = step(token, hidden, *kv, position)
            guesses.append(token.reshape(1))
            yield
        tokens = mx.concatenate(guesses) if guesses else mx.zeros((0,), mx.int32)  # int32 steps
        return Draft(tokens, mx.stack(qs) if sampled and qs else None, source="mtp", steps=guesses)

    def _step(self, settings: Optional[SamplingSettings], shapes: tuple):
        """One draft step as a compiled function: a few fused kernels instead of hundreds of
        primitives, and a few microseconds of host time instead of a Python trace. Its inputs
        keep their shapes from cycle to cycle (whole cache buffers, masked), so it is traced
        again only when a cache grows its buffer (bounded: see traces.py)."""
        key = None if settings is None else settings.unseeded()
        return self.traces.get((key, shapes), lambda: self._sampled_step(key) if key else self._argmax_step)

    def _layers(self, token, hidden, ks, vs, ms, kf, vf, mf, position):
        kv, masks = {SLIDING: (ks, vs), FULL: (kf, vf)}, {SLIDING: ms, FULL: mf}
        return self.assistant.step(self.target.embed(token), hidden, kv, position, masks)

    def _argmax_step(self, token, hidden, *kv_and_position):
        h, hidden = self._layers(token, hidden, *kv_and_position)
        # int32, as the first step's input token: one trace serves every step.
        return self.assistant.greedy_token(h).astype(mx.int32), hidden

    def _sampled_step(self, settings: SamplingSettings):
        def step(token, hidden, ks, vs, ms, kf, vf, mf, position, uniforms):
            h, hidden = self._layers(token, hidden, ks, vs, ms, kf, vf, mf, position)
            dist = distribution(self.assistant.full_logits(h)[0, 0], settings)
            token = dist.sample(uniforms).reshape(1, 1).astype(mx.int32)
            return token, hidden, dist.dense(self.assistant.vocab_size)

        return step


class PromptLookup:
    """Guesses by copying: find the longest recent n-gram (4 down to 2 tokens) that ends the
    settled text and occurred before, in the prompt or the generated text, and propose what
    followed it. Free to compute, and right whenever the answer copies (a time from a tool
    result, code being edited). Deterministic guesses: no q. The n-grams are indexed with the
    sequence (`SequenceState.ngrams`), so a cycle costs O(new tokens), not O(context)."""

    reads_tokens = True

    def continuation(self, context: DraftContext, g: int) -> List[int]:
        return context.ngrams.continuation(context.tokens, g)

    def draft(self, context: DraftContext, g: int) -> Draft:
        return Draft(mx.array(self.continuation(context, g), dtype=mx.int32), source="lookup")


class LookupThenMTP:
    """Prompt-lookup guesses where the text has a match, the MTP drafter's where it has none;
    one verification pass per cycle either way."""

    reads_tokens = True

    def __init__(self, lookup: PromptLookup, mtp: MTPDrafter):
        self.lookup, self.mtp = lookup, mtp

    def ahead_drafter(self, last_source: str) -> Optional[MTPDrafter]:
        """Where the text had no match last cycle, the assistant guesses ahead of the host;
        where it had one, the next cycle waits for the tokens, to look them up."""
        return None if last_source == "lookup" else self.mtp

    def draft(self, context: DraftContext, g: int) -> Draft:
        guesses = self.lookup.continuation(context, g)
        if guesses:
            return Draft(mx.array(guesses, dtype=mx.int32), source="lookup")
        return self.mtp.draft(context, g)
