"""The speculative loop: draft g, verify g + 1 positions in one target pass, accept, trim.

Each cycle is built as one lazy MLX graph (the g draft steps, the verification pass, the
acceptance test and the per-token reports), launched in stages (launch.py) and synchronised
once: exactly one host synchronisation per cycle, counted in the statistics. While the device
works on a cycle, the previous cycle's tokens are handed to the caller, so printing overlaps
compute.

MTP off is the same loop with g = 0: one position per pass, the same reports and statistics.
"""

import time
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import mlx.core as mx

from .policy import AcceptanceStats, AdaptiveDraftLength, FixedDraftLength
from .cycle import Cycle, CycleBuilder, Start
from .drafting import Drafter, as_drafter
from .launch import Launcher
from .pieces import HostWork, Pieces
from .reports import TokenReport, build_reports
from .sampling import SamplingSettings, SettingsError, uniform_streams
from .gemma4 import MAX_DRAFT_TOKENS
from .sequence import SequenceState
from .stats import Stats
from .target import Target

__all__ = ["Decoder", "SequenceState", "Stats", "MAX_DRAFT_TOKENS"]
ADAPTIVE_MAX_G = 8  # the longest draft the adaptive choice considers
# How likely the running cycle's outcome must be for the next cycle to be built ahead for it.
AHEAD_BELIEF = 0.8


@dataclass
class _Ahead:
    """A cycle built while the one before it runs, for an assumed outcome of that one."""

    cycle: Cycle
    settles: int  # tokens the running cycle was assumed to settle
    snapshot: Optional[list]  # the caches before it was built; None once it is launched


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
        target: Target,
        settings: SamplingSettings,
        drafter: Optional[Drafter] = None,
        draft_tokens: Optional[int] = None,
        report: bool = True,
        stop_tokens: Sequence[int] = (),
        prefill_chunk: int = 512,
    ):
        """draft_tokens: guesses per cycle, or None to choose them each cycle (adaptive)."""
        if drafter is not None and draft_tokens is not None and not 0 <= draft_tokens <= MAX_DRAFT_TOKENS:
            raise SettingsError(f"draft tokens must be between 0 and {MAX_DRAFT_TOKENS}, got {draft_tokens}")
        drafter = as_drafter(drafter)
        self.target = target
        self.settings = settings
        self.drafter = drafter
        self.draft_tokens = 0 if drafter is None else draft_tokens
        # Acceptance by guess position: the draft length's and the likely outcome's.
        stats = AcceptanceStats(MAX_DRAFT_TOKENS)
        self.policy = (AdaptiveDraftLength(ADAPTIVE_MAX_G, stats) if self.draft_tokens is None
                       else FixedDraftLength(self.draft_tokens, stats))
        self.report = report
        self.stop_tokens = set(stop_tokens)
        self.prefill_chunk = prefill_chunk
        self.uniforms = uniform_streams(settings.seed)
        self.builder = CycleBuilder(target, settings, self.uniforms, report)
        self.stats = Stats()
        self.launcher = Launcher(self.stats)

    def start(self, state: SequenceState, tokens: List[int]) -> None:
        """Make `state` hold the prompt `tokens`, ready to generate: it goes back to the longest
        prefix it shares with them (see `SequenceState.rewind`), the rest goes through the
        target, and the point is marked for the next turn to come back to. (Whether the
        prompt and its answer fit the context is the request path's to check: generation.py.)"""
        held = state.rewind(tokens)
        self.add_tokens(state, tokens[held:])
        state.mark()

    def add_tokens(self, state: SequenceState, tokens: List[int]) -> None:
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
        processed = state.add_prompt(tokens, self.prefill_chunk)
        self.stats.prompt_reused += reused
        self.stats.prompt_tokens += processed
        self.stats.prompt_seconds += time.perf_counter() - start

    def generate(self, state: SequenceState, max_tokens: int) -> Iterator[TokenReport]:
        """Yield the reports of up to `max_tokens` new tokens as they settle.

        While the device runs a cycle, the host builds the next one for the running cycle's
        likely outcome (`_build_ahead`), a draft step at a time between the stages of the
        running cycle's launch (`_launch`; see launch.py). When the running cycle has no
        guesses its outcome is certain, and the next one is queued at once, as mlx-lm queues its
        next step. Otherwise the next one waits for the sync: if the outcome was as assumed, its
        first stage is launched with no host work in between; if not, the caches are put back
        as they stood (references, no copies; the graph built ahead is never computed) and the
        next cycle is built anew.
        """
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        start = time.perf_counter()
        produced, pending, current, ahead = 0, _Pending(), None, None
        self.launcher.synced_at = None
        try:
            while produced < max_tokens:
                budget = max_tokens - produced
                if current is None:
                    current = self.builder.build(state, Start.settled(state), self.policy.choose(budget), self.drafter)
                # The rest of the cycle is launched stage by stage, the next one built in between.
                ahead = self._launch(state, current, self._build_ahead(state, current, budget))
                if ahead is not None and ahead.snapshot is None:  # a certain outcome: queue it now
                    self._launch(state, ahead.cycle)
                yield from pending.hand_over()  # while the device works on this cycle
                tokens, kept, fetched = self._sync(current, budget, launched_next=ahead is not None and ahead.snapshot is None)
                stop = tokens[-1] in self.stop_tokens
                hit = ahead is not None and len(tokens) == ahead.settles and not stop
                if ahead is not None and not hit:
                    self._undo(state, ahead)
                    current.seconds += ahead.cycle.seconds  # built for nothing: this cycle's cost
                    ahead = None
                elif hit and ahead.snapshot is not None:
                    ahead.snapshot = None
                    self.launcher.stage(ahead.cycle)  # the device has work while this one settles
                    self.stats.prebuilt += 1
                elif hit:
                    self.stats.prebuilt += 1
                hidden_before = state.hidden
                reports = self._settle(state, current, tokens, kept, fetched, trimmed=hit)
                pending = _Pending(reports, hidden_before, current.hidden)
                produced += len(reports)
                self.policy.observe(current.g, min(kept, len(tokens)), current.seconds, asked=current.asked)
                current, ahead = (ahead.cycle if hit else None), None
                if stop:
                    break
            yield from pending.hand_over()
        finally:
            # However it ends (done, a stop, the caller leaving early, an error), the state must
            # hold exactly the tokens handed over: drop the rest, and every queued position.
            if ahead is not None and ahead.snapshot is not None:
                state.restore(ahead.snapshot)
            self.policy.withdraw()  # a probe chosen for a cycle that never settled is still to come
            self._unsettle(state, pending)
            state.trim_to_settled()
            self.stats.generation_seconds += time.perf_counter() - start
            self.stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    def _build_ahead(self, state: SequenceState, running: Cycle, budget: int) -> HostWork:
        """The next cycle, built (in pieces) for the running cycle's likely outcome; None when
        there is no room for another cycle, or when the outcome is too uncertain for the work to
        pay: the host's build overlaps the device only partly, and a cycle built for nothing
        costs its whole build."""
        certain = running.g == 0
        settles, p = (1, 1.0) if certain else self.policy.stats.likely_outcome(running.g)
        if budget - settles < 1 or p < AHEAD_BELIEF:
            return None
        g = self.policy.choose(budget - settles)
        drafter = self.drafter.for_ahead(running.source) if g > 0 else None
        if g > 0 and drafter is None:
            self.policy.withdraw()
            return None  # the drafter needs the tokens on the host: the cycle waits for them
        # A certain outcome is launched at once; only an uncertain one may have to be undone.
        snapshot = None if certain else state.snapshot()
        # The caches hold the running cycle's g + 1 positions; keep those its outcome keeps.
        state.trim(running.g + 1 - settles)
        try:
            cycle = yield from self.builder.pieces(state, Start.ahead(state, running, settles), g, drafter)
        except BaseException:  # a failure, or the launch around it failed and closed it
            if snapshot is not None:
                state.restore(snapshot)
            raise
        return _Ahead(cycle, settles, snapshot)

    def _undo(self, state: SequenceState, ahead: _Ahead) -> None:
        """The running cycle settled otherwise than assumed: drop the cycle built ahead."""
        self.policy.withdraw()
        if ahead.snapshot is not None:
            state.restore(ahead.snapshot)
        else:  # launched already (its outcome was certain but a stop token came): trim it
            state.trim(ahead.cycle.g + 1)

    def _launch(self, state: SequenceState, cycle: Cycle, ahead: Optional[HostWork] = None) -> Optional[_Ahead]:
        """Launch the rest of the cycle, building the next one (`_build_ahead`) in between;
        return that, its host time counted to it. If the launch fails once it is built, it is
        undone before the error goes on."""
        if ahead is None:
            self.launcher.launch(cycle)
            return None
        build = Pieces(ahead)
        try:
            self.launcher.launch(cycle, build)
        except BaseException:
            if build.done and build.result is not None:
                self._undo(state, build.result)
            raise
        if build.result is not None:
            build.result.cycle.seconds += build.seconds
        return build.result

    def _sync(self, cycle: Cycle, budget: int, launched_next: bool):
        """The cycle's one host synchronisation: its output tokens (cut at a stop token and at
        `budget`), how many guesses were kept, and the report figures."""
        began = time.perf_counter()
        mx.eval(cycle.arrays())
        self.stats.host_syncs += 1
        synced = time.perf_counter()
        cycle.seconds += synced - began
        self.launcher.synced_at = None if launched_next else synced
        kept = cycle.kept.item()
        tokens = cycle.tokens.tolist()[: kept + 1][:budget]
        for i, token in enumerate(tokens):
            if token in self.stop_tokens:
                tokens = tokens[: i + 1]
                break
        return tokens, kept, {k: v.tolist() for k, v in cycle.reports.items()}

    def _settle(self, state: SequenceState, cycle: Cycle, tokens: List[int], kept: int, fetched: dict, trimmed: bool):
        """Append the cycle's tokens to the state; cut the caches to them (unless a cycle built
        ahead for this outcome did so already)."""
        n = len(tokens)
        reports = build_reports(fetched, tokens, [i < kept for i in range(n)], self.stats.cycles)
        if not trimmed:
            # The caches hold the last settled token and g guesses; keep it and n - 1 guesses.
            state.trim(cycle.g + 1 - n)
        state.settle(tokens, cycle.hidden[:, n - 1 : n])
        self.stats.count(cycle.g, cycle.source, min(kept, n), n)
        return reports

    def _unsettle(self, state: SequenceState, pending: "_Pending") -> None:
        """Take back the settled tokens that were never handed over."""
        unsent = len(pending.reports) - pending.sent
        if unsent <= 0:
            return
        kept = pending.sent
        state.take_back(unsent, pending.hidden_before if kept == 0 else pending.hidden[:, kept - 1 : kept])
        self.stats.generated_tokens -= unsent
