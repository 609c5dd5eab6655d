"""One request's decoding: its sampling settings and seed, its drafter and draft length, its
statistics; its prompt put through the target (`start`), and its tokens generated (`generate`).

The loop itself is the batch's (batch.py): a generation alone is a batch of one row, the same
steps as several requests at once, not a second loop beside it. Each step drafts g guesses,
verifies g + 1 positions in one target pass, accepts and trims; it is built as one lazy MLX
graph and synchronised once (exactly one host synchronisation per cycle, counted in the
statistics), and the next step is built from the running one's lazy outputs and queued before
it syncs, so that while the device works the previous step's tokens are handed to the caller.

MTP off is the same loop with g = 0: one position per pass, the same reports and statistics.
"""

import time
from typing import Callable, Iterator, List, Optional, Sequence

from mlx_lm.generate import wired_limit

from ..drafting import Drafter, as_drafter
from ..drafting.forced import SOURCE as FORCED, ForcedTokens
from ..errors import SettingsError
from ..media.items import MediaSpan
from ..models.protocol import TargetModel
from ..sampling.settings import SamplingSettings
from ..sampling.uniforms import uniform_streams
from .batch import Batch
from .cycle import Cycle, CycleBuilder
from .draft_lengths import DraftLengths
from .limits import PREFILL_CHUNK, check_draft_tokens
from .policy import DraftLength
from .reports import WAITING, TokenReport, build_reports
from .rows import Outcome
from .sequence import SequenceState
from .stats import Stats

__all__ = ["Decoder"]


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
        lengths: Optional[DraftLengths] = None,
        constraint=None,
        forced_guesses: bool = False,
    ):
        """draft_tokens: guesses per cycle, or None to choose them each cycle (adaptive).
        lengths: the engine's cost model of a step (draft_lengths.py), shared by every
        generation on it; a fresh one if None. constraint: the answer's grammar matcher
        (constraints/matcher.py): at every verified position the target's distribution is
        restricted to what it allows."""
        if drafter is not None:
            check_draft_tokens(draft_tokens)
        if settings.top_k > target.vocab_size:
            raise SettingsError(f"top_k must be at most the vocabulary's {target.vocab_size} tokens (0 turns it off), "
                                f"got {settings.top_k}")
        drafter = as_drafter(drafter)
        self.target = target
        self.settings = settings
        self.drafter = drafter
        self.lengths = lengths if lengths is not None else DraftLengths()
        self.policy = DraftLength(0 if drafter is None else draft_tokens, prior=self.lengths.acceptance)
        self.report = report
        self.stop_tokens = set(stop_tokens)
        self.prefill_chunk = prefill_chunk
        self.uniforms = uniform_streams(settings.seed)
        self.constraint = constraint
        # The guesses its grammar forces, drafted whenever it has some (drafting/forced.py):
        # with the engine's own drafting, not with a drafter given or none.
        self.forced = ForcedTokens(constraint) if constraint is not None and forced_guesses and drafter else None
        self.stats = Stats()
        self.builder = CycleBuilder(target, settings, self.uniforms, report, constraint, self.stats)

    @property
    def draft_tokens(self) -> Optional[int]:
        """Guesses per cycle when fixed (0 without a drafter); None when chosen each cycle."""
        return self.policy.fixed

    def start(self, state: SequenceState, tokens: List[int], spans: Sequence[MediaSpan] = (),
              stop: Optional[Callable[[], bool]] = None) -> None:
        """Make `state` hold the prompt `tokens`, ready to generate: it goes back to the longest
        prefix it shares with them (see `SequenceState.rewind`), the rest goes through the
        target, and the point is marked for the next turn to come back to. (Whether the
        prompt and its answer fit the context is the request path's to check: generation.py.)
        `stop`: asked between prefill chunks (see `SequenceState.add_prompt`)."""
        held = state.rewind(tokens, spans)
        if held and state.cached == held - 1:
            # Marked where this prompt leaves the last one: a later prompt that leaves this one
            # earlier (a message edited, a conversation forked, this prompt stopped part way)
            # resumes here, not from the start (the rewind dropped the marks past this point).
            state.mark()
        self.add_tokens(state, tokens[held:], spans, stop)
        state.mark()

    def check_prompt(self, tokens: List[int]) -> None:
        """A SettingsError for an empty prompt or token ids outside the vocabulary."""
        if not tokens:
            raise SettingsError("the prompt is empty")
        vocab = self.target.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise SettingsError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")

    def add_tokens(self, state: SequenceState, tokens: List[int], spans: Sequence[MediaSpan] = (),
                   stop: Optional[Callable[[], bool]] = None) -> None:
        """Append prompt tokens: all but the last go through the target now (in chunks). The
        tokens generated after them are a new answer (its uniforms start again at index 0). If
        the target fails on them, the state is emptied: its caches may be half written."""
        self.check_prompt(tokens)
        start = time.perf_counter()
        reused = state.cached
        processed = state.add_prompt(tokens, self.prefill_chunk, spans, stop)
        self.stats.media_tokens += sum(s.item.tokens for s in state.spans if s.start >= reused)
        self.stats.prompt_reused += reused
        self.stats.prompt_tokens += processed
        self.stats.prompt_length = len(state.tokens)
        self.stats.prompt_seconds += time.perf_counter() - start

    def generate(self, state: SequenceState, max_tokens: int) -> Iterator[TokenReport]:
        """Yield the reports of up to `max_tokens` new tokens as they settle: a batch of this
        one row, stepped whenever its reader has taken what settled. However it ends (done, a
        stop, the caller leaving early, an error), the state holds exactly the tokens handed
        over.

        While it decodes, the model's memory is wired as mlx-lm wires it (`wired_limit`: on a
        Mac, the wired limit raised to the GPU's recommended working set, with a warning for a
        model close to it, and restored after a sync): under memory pressure macOS would
        otherwise page the weights out between cycles. Without Metal it does nothing.
        """
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        with wired_limit(self.target.model):
            batch = Batch(self.target, self.lengths)
            reader = batch.join(self, state, max_tokens)
            try:
                for report in reader:
                    if report is WAITING:
                        batch.step()
                    else:
                        yield report
            finally:
                reader.close()

    def take_back(self, state: SequenceState, n: int, hidden) -> None:
        """The last `n` settled tokens go back (never handed over), the constraint's with them."""
        state.take_back(n, hidden)
        if self.constraint is not None and n > 0:
            self.constraint.take_back(n)

    def settle(self, state: SequenceState, cycle: Cycle, outcome: Outcome) -> List[TokenReport]:
        """Append the cycle's tokens to the state and cut its rejected guesses from the caches
        (a step queued after it keeps its positions, which follow the settled ones); its
        reports."""
        n = len(outcome.tokens)
        reports = build_reports(outcome.figures, outcome.tokens, [i < outcome.kept for i in range(n)], self.stats.cycles)
        # The caches hold the last settled token and g guesses; keep it and n - 1 guesses.
        state.trim(cycle.g + 1 - n)
        state.settle(outcome.tokens, cycle.hidden[:, n - 1 : n])
        if self.drafter is not None:
            self.drafter.accept(state, outcome.tokens)
        if self.constraint is not None:
            self.constraint.advance(outcome.tokens)
            self.stats.constrained_tokens += n
        self.stats.count(cycle.g, cycle.source, min(outcome.kept, n), n)
        self.stats.prebuilt += cycle.built_ahead
        if cycle.source == FORCED:  # outside the draft length's choice: it learns nothing from them
            self.policy.observe(0, 0, asked=cycle.asked, pooled=False)
        else:
            self.policy.observe(cycle.g, min(outcome.kept, n), asked=cycle.asked, pooled=not cycle.copied)
        return reports
