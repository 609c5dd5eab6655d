"""One cycle of the speculative loop as a lazy MLX graph: the drafter's g guesses, one target
pass over the last settled token and the guesses (g + 1 positions), the acceptance test and the
per-token report figures. Nothing here synchronises: the loop evaluates the whole cycle once.

A cycle is built from the settled state (`Start.settled`), or ahead (`Start.after`): from a
cycle still running, whatever it keeps. The running cycle's outputs (how many guesses it kept,
the token after them, the hidden state there) are lazy arrays, and the next cycle's graph reads
them on the device: its input token, its drafter's hidden state and K/V range, the offset its
target pass writes at and the index of its uniforms. The host only needs bounds (the running
cycle settles 1 to g + 1 tokens), to size the caches' buffers.
"""

import time
from dataclasses import dataclass
from typing import Dict, Optional, Union

import mlx.core as mx

from ..drafting import Draft, DraftContext, Drafter
from ..drafting.pieces import run_through
from ..errors import SettingsError
from ..models.protocol import TargetModel
from ..sampling.settings import SamplingSettings
from .sequence import SequenceState
from .verify import Verifier


@dataclass
class Start:
    """What is settled before a cycle: its input token and the target's hidden state before it
    (arrays, possibly still being computed), the settled tokens and generated tokens the host
    knows of, and, for a cycle built ahead, how many more the running cycle settles (a device
    array, at most `most`)."""

    last: mx.array  # [1, 1]
    hidden: Optional[mx.array]  # [1, 1, H]; None before the first target pass
    length: int  # settled tokens on the host
    generated: int  # of them, generated in this answer: the output index of the cycle's first token
    # Tokens the running cycle settles beyond `length`: a device array (at most `most`), or 1
    # when it has no guesses (the host knows that much: see `after`).
    ahead: Union[None, int, mx.array] = None
    most: int = 0
    built_ahead: bool = False  # built before the cycle it follows had synced

    @classmethod
    def settled(cls, state: SequenceState) -> "Start":
        last = mx.array([state.tokens[-1:]], dtype=mx.int32)
        return cls(last, state.hidden, len(state.tokens), state.generated)

    @classmethod
    def after(cls, state: SequenceState, running: "Cycle") -> "Start":
        """After `running` settles, whatever it keeps: its kept guesses and the token after
        them. (The state must hold the tokens settled before `running`.) A cycle without
        guesses settles exactly one token: the host knows where the next one starts, and its
        graph needs none of the device-side arithmetic (a few primitives fewer per cycle, which
        on MLX's CPU backend is measurable in MTP off's speed)."""
        length, generated = len(state.tokens), state.generated
        if running.g == 0:
            return cls(running.tokens[None, :1], running.hidden, length, generated, 1, 1, built_ahead=True)
        kept = running.kept.reshape(1)
        last = mx.take(running.tokens, kept).reshape(1, 1)
        hidden = mx.take(running.hidden, kept, axis=1)
        return cls(last, hidden, length, generated, kept[0] + 1, running.g + 1, built_ahead=True)

    def uniforms(self, stream, first: int, n: int) -> mx.array:
        """The uniforms of the cycle's output positions first .. first + n - 1 (see sampling.py)."""
        if isinstance(self.ahead, mx.array):
            return stream.take(self.generated + first, n, self.ahead, self.most)
        return stream.take(self.generated + (self.ahead or 0) + first, n)


@dataclass
class Cycle:
    """One row's part of a step: its guesses verified, and what the acceptance made of them."""

    start: Start
    g: int  # guesses verified
    asked: int  # guesses asked for (a drafter may propose fewer)
    source: str  # who made them
    kept: mx.array
    tokens: mx.array  # [g + 1]: the first kept + 1 are the output
    hidden: mx.array  # [1, g + 1, H]
    reports: Dict[str, mx.array]
    copied: bool = False  # the guesses were copied from the text (`Draft.copied`)

    def arrays(self) -> list:
        return [self.kept, self.tokens, self.hidden, *self.reports.values()]

    @property
    def built_ahead(self) -> bool:
        return self.start.built_ahead


class CycleBuilder:
    def __init__(self, target: TargetModel, settings: SamplingSettings, uniforms: dict, report: bool,
                 constraint=None, stats=None):
        """constraint: the answer's grammar matcher (constraints/matcher.py), or None; stats: the
        request's (decoding/stats.py), which the masks' host time goes to."""
        self.target, self.settings, self.uniforms = target, settings, uniforms
        self.verifier = Verifier(settings, report, target.traces)
        self.constraint, self.stats = constraint, stats

    def build(self, state: SequenceState, start: Start, g: int, drafter: Optional[Drafter]) -> Cycle:
        """The lazy graph of one cycle in the sequence's own caches, from its settled state:
        draft g, verify g + 1 positions, accept, report. (The loop's steps are built by
        batch_step.py; this is a sequence's first cycle, before its caches hold anything to
        join the loop's storage with.)"""
        asked, draft = g, Draft(mx.zeros((0,), mx.int32), source="none")
        if start.hidden is None or drafter is None:
            g = 0  # nothing in the caches yet for a drafter to read, or no drafter
        if g > 0:
            draft = self.check(run_through(drafter.draft_steps(self.context(state, start, g), g)), g)
        # A guess outside the vocabulary is never kept (no id equals it); clipped, it reads no
        # embedding row out of bounds.
        vocab = self.target.vocab_size
        inputs = mx.concatenate([start.last, mx.clip(draft.tokens, 0, vocab - 1)[None]], axis=1)
        logits, hidden = self.target.forward(inputs, state.cache)
        kept, tokens, reports = self.verify(start, logits[0], draft, self.mask(draft.tokens, g + 1)[0])
        return Cycle(start, draft.tokens.shape[0], asked, draft.source, kept, tokens, hidden, reports, draft.copied)

    def verify(self, start: Start, logits: mx.array, draft: Draft, mask: Optional[mx.array] = None):
        """(kept, tokens, reports) of a draft from the target's logits [g + 1, V] at the last
        settled token and the guesses, with the uniforms of the cycle's output positions;
        `mask`: the constraint's allowed tokens at those positions (`mask`), or None."""
        g = draft.tokens.shape[0]

        def uniforms(stream, first, n):
            return start.uniforms(self.uniforms[stream], first, n)

        if draft.q is None:
            return self.verifier.by_match(logits, draft.tokens, uniforms("target", 0, g + 1), mask)
        return self.verifier.by_ratio(
            logits,
            draft.tokens,
            draft.q,
            uniforms("accept", 0, g)[:, 0],
            uniforms("residual", 0, g),
            uniforms("target", g, 1)[0],
            mask,
        )

    def mask(self, guesses: mx.array, positions: int) -> tuple:
        """(the constraint's packed allowed tokens [positions, words] at the settled point and
        after each guess, how many of the guesses may be kept: `Matcher.masks`); (None, all)
        without a constraint. It reads the guesses on the host: a constrained cycle is built from
        settled tokens, and waits for its drafts."""
        if self.constraint is None:
            return None, guesses.shape[0]
        began = time.perf_counter()
        masks, usable = self.constraint.masks(guesses.tolist(), positions)
        if self.stats is not None:
            self.stats.mask_seconds += time.perf_counter() - began
        return mx.array(masks), usable

    def target_uniforms(self, start: Start, n: int) -> mx.array:
        """The target's draws' uniforms for the cycle's first n output positions ([n, 2])."""
        return start.uniforms(self.uniforms["target"], 0, n)

    def context(self, state: SequenceState, start: Start, g: int) -> DraftContext:
        """What a drafter reads for a cycle from `start`."""
        return DraftContext(
            tokens=state.tokens,
            ngrams=state.ngrams,
            last_token=start.last,
            hidden=start.hidden,
            kv=self.target.drafter_buffers(state.cache),
            settings=self.settings,
            uniforms=start.uniforms(self.uniforms["draft"], 0, g),
            ahead=start.ahead,
        )

    def check(self, draft: Draft, g: int) -> Draft:
        """The draft, if it is one of up to g guesses (a drafter given by a user may be wrong)."""
        n = draft.tokens.shape[0] if draft.tokens.ndim == 1 else -1
        if not 0 <= n <= g or not mx.issubdtype(draft.tokens.dtype, mx.integer):
            raise SettingsError(f"drafter returned guesses {draft.tokens.shape} {draft.tokens.dtype}, expected up to {g} integers")
        if draft.q is not None and draft.q.shape != (n, self.target.vocab_size):
            raise SettingsError(f"drafter returned q of shape {draft.q.shape}, expected ({n}, {self.target.vocab_size})")
        return draft
