"""The speculative loop: draft g, verify g + 1 positions in one target pass, accept, trim.

Each cycle is built as one lazy MLX graph (the g draft steps, the verification pass, the
acceptance test and the per-token reports) and synchronised once: exactly one host
synchronisation per cycle, counted in the statistics. The next cycle is built from the running
one's lazy outputs and queued before the running one syncs, whatever it keeps (pipeline.py);
while the device works, the previous cycle's tokens are handed to the caller, so printing
overlaps compute.

MTP off is the same loop with g = 0: one position per pass, the same reports and statistics.
"""

import time
from typing import Callable, Iterator, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import wired_limit

from ..drafting import Drafter, as_drafter
from ..errors import SettingsError
from ..media.items import MediaSpan
from ..models.protocol import TargetModel
from ..sampling.settings import SamplingSettings
from ..sampling.uniforms import uniform_streams
from .cycle import Cycle, CycleBuilder
from .limits import ADAPTIVE_MAX_G, MAX_DRAFT_TOKENS, PREFILL_CHUNK, check_draft_tokens
from .pipeline import Outcome, Pipeline
from .policy import AcceptanceStats, AdaptiveDraftLength, FixedDraftLength
from .reports import TokenReport, build_reports
from .sequence import SequenceState
from .stats import Stats

__all__ = ["Decoder"]


class _Pending:
    """A settled cycle's reports, handed to the caller one by one (counting how many went)."""

    def __init__(self, reports=(), hidden_before=None, hidden=None):
        self.reports, self.hidden_before, self.hidden = list(reports), hidden_before, hidden
        self.sent = 0

    def hand_over(self):
        for report in self.reports[self.sent :]:
            self.sent += 1
            yield report


class Decoder:
    def __init__(
        self,
        target: TargetModel,
        settings: SamplingSettings,
        drafter: Optional[Drafter] = None,
        draft_tokens: Optional[int] = None,
        report: bool = True,
        stop_tokens: Sequence[int] = (),
        prefill_chunk: int = PREFILL_CHUNK,
    ):
        """draft_tokens: guesses per cycle, or None to choose them each cycle (adaptive)."""
        if drafter is not None:
            check_draft_tokens(draft_tokens)
        if settings.top_k > target.vocab_size:
            raise SettingsError(f"top_k must be at most the vocabulary's {target.vocab_size} tokens (0 turns it off), "
                                f"got {settings.top_k}")
        drafter = as_drafter(drafter)
        self.target = target
        self.settings = settings
        self.drafter = drafter
        self.draft_tokens = 0 if drafter is None else draft_tokens
        # Acceptance by guess position, which the draft length is chosen from.
        stats = AcceptanceStats(MAX_DRAFT_TOKENS)
        self.policy = (AdaptiveDraftLength(ADAPTIVE_MAX_G, stats) if self.draft_tokens is None
                       else FixedDraftLength(self.draft_tokens, stats))
        self.report = report
        self.stop_tokens = set(stop_tokens)
        self.prefill_chunk = prefill_chunk
        self.uniforms = uniform_streams(settings.seed)
        self.builder = CycleBuilder(target, settings, self.uniforms, report)
        self.stats = Stats()
        self.pipeline = Pipeline(self.builder, self.policy, drafter, self.stats, self.stop_tokens)

    def start(self, state: SequenceState, tokens: List[int], spans: Sequence[MediaSpan] = (),
              stop: Optional[Callable[[], bool]] = None) -> None:
        """Make `state` hold the prompt `tokens`, ready to generate: it goes back to the longest
        prefix it shares with them (see `SequenceState.rewind`), the rest goes through the
        target, and the point is marked for the next turn to come back to. (Whether the
        prompt and its answer fit the context is the request path's to check: generation.py.)
        `stop`: asked between prefill chunks (see `SequenceState.add_prompt`)."""
        held = state.rewind(tokens, spans)
        self.add_tokens(state, tokens[held:], spans, stop)
        state.mark()

    def add_tokens(self, state: SequenceState, tokens: List[int], spans: Sequence[MediaSpan] = (),
                   stop: Optional[Callable[[], bool]] = None) -> None:
        """Append prompt tokens: all but the last go through the target now (in chunks). The
        tokens generated after them are a new answer (its uniforms start again at index 0). If
        the target fails on them, the state is emptied: its caches may be half written."""
        if not tokens:
            raise SettingsError("the prompt is empty")
        vocab = self.target.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise SettingsError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        start = time.perf_counter()
        reused = state.cached
        processed = state.add_prompt(tokens, self.prefill_chunk, spans, stop)
        self.stats.media_tokens += sum(s.item.tokens for s in state.spans if s.start >= reused)
        self.stats.prompt_reused += reused
        self.stats.prompt_tokens += processed
        self.stats.prompt_seconds += time.perf_counter() - start

    def generate(self, state: SequenceState, max_tokens: int) -> Iterator[TokenReport]:
        """Yield the reports of up to `max_tokens` new tokens as they settle.

        Each turn: the running cycle is launched, with the next one built ahead of it and
        queued behind it (`Pipeline.advance`); the previous cycle's tokens are handed over
        while the device works; the running cycle syncs and settles.

        While it decodes, the model's memory is wired as mlx-lm wires it (`wired_limit`: on a
        Mac, the wired limit raised to the GPU's recommended working set, with a warning for a
        model close to it, and restored after a sync): under memory pressure macOS would
        otherwise page the weights out between cycles. Without Metal it does nothing.
        """
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        with wired_limit(self.target.model):
            yield from self._generate(state, max_tokens)

    def _generate(self, state: SequenceState, max_tokens: int) -> Iterator[TokenReport]:
        began = time.perf_counter()
        produced, pending, upcoming = 0, _Pending(), None
        self.pipeline.restart()
        if self.drafter is not None:
            self.drafter.begin(state)
        try:
            while produced < max_tokens:
                budget = max_tokens - produced
                running = upcoming or self.pipeline.first(state, budget)
                upcoming = self.pipeline.advance(state, running, budget)
                yield from pending.hand_over()  # while the device works on `running`
                outcome = self.pipeline.sync(running, budget, upcoming)
                pending = self.settle(state, running, outcome)
                produced += len(outcome.tokens)
                if outcome.stopped:
                    break
            yield from pending.hand_over()
        finally:
            # However it ends (done, a stop, the caller leaving early, an error), the state must
            # hold exactly the tokens handed over: drop the rest, and every queued position.
            self.policy.withdraw()  # a probe chosen for a cycle that never settled is still to come
            self._unsettle(state, pending)
            state.trim_to_settled()
            self.stats.generation_seconds += time.perf_counter() - began
            self.stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    def settle(self, state: SequenceState, cycle: Cycle, outcome: Outcome, timed: bool = True) -> _Pending:
        """Append the cycle's tokens to the state and cut its rejected guesses from the caches
        (a cycle queued after it keeps its positions, which follow the settled ones). `timed`:
        whether the cycle's time is its own (in a batch it is the batch's: decoding/batch.py)."""
        n = len(outcome.tokens)
        reports = build_reports(outcome.figures, outcome.tokens, [i < outcome.kept for i in range(n)], self.stats.cycles)
        # The caches hold the last settled token and g guesses; keep it and n - 1 guesses.
        state.trim(cycle.g + 1 - n)
        hidden_before = state.hidden
        state.settle(outcome.tokens, cycle.hidden[:, n - 1 : n])
        if self.drafter is not None:
            self.drafter.accept(state, outcome.tokens)
        self.stats.count(cycle.g, cycle.source, min(outcome.kept, n), n)
        self.stats.prebuilt += cycle.built_ahead
        # A cycle that traced a compiled function is not timed: one trace of E2B's pass takes
        # several cycles' time, and a length it made look dear would not be tried again.
        self.policy.observe(cycle.g, min(outcome.kept, n), cycle.seconds if timed and not cycle.traced else None,
                           asked=cycle.asked)
        return _Pending(reports, hidden_before, cycle.hidden)

    def _unsettle(self, state: SequenceState, pending: "_Pending") -> None:
        """Take back the settled tokens that were never handed over."""
        unsent = len(pending.reports) - pending.sent
        if unsent <= 0:
            return
        kept = pending.sent
        state.take_back(unsent, pending.hidden_before if kept == 0 else pending.hidden[:, kept - 1 : kept])
        self.stats.generated_tokens -= unsent
