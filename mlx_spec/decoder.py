"""The speculative loop: draft g, verify g + 1 positions in one target pass, accept, trim.

Each cycle is built as one lazy MLX graph (the g draft steps, the verification pass, the
acceptance test and the per-token reports) and evaluated once: exactly one host
synchronisation per cycle, counted in the statistics. While the device works on a cycle, the
previous cycle's tokens are handed to the caller (`mx.async_eval`), so printing overlaps compute.

MTP off is the same loop with g = 0: one position per pass, the same reports and statistics.
"""

import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

import mlx.core as mx

from .adaptive import AdaptiveDraftLength
from .drafters import Draft, DraftContext, Drafter
from .reports import TokenReport, build_reports, report_arrays
from .sampling import SamplingSettings, SettingsError, accept_by_match, accept_by_ratio, distribution, uniform_streams
from .sequence import MAX_DRAFT_TOKENS, SequenceState
from .target import Target, prefill, trim_cache

__all__ = ["Decoder", "SequenceState", "Stats", "MAX_DRAFT_TOKENS"]
ADAPTIVE_MAX_G = 8  # the longest draft the adaptive choice considers


@dataclass
class Stats:
    prompt_tokens: int = 0  # prompt tokens that went through the target
    prompt_reused: int = 0  # prompt tokens whose keys and values were already in the caches
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    cycles: int = 0
    drafted: int = 0
    kept: int = 0
    kept_by_position: List[int] = field(default_factory=list)  # [i]: cycles that kept guess i + 1
    cycles_by_g: Dict[int, int] = field(default_factory=dict)  # cycles per number of guesses
    kept_by_source: Dict[str, int] = field(default_factory=dict)  # kept guesses per drafter
    drafted_by_source: Dict[str, int] = field(default_factory=dict)
    host_syncs: int = 0  # synchronisations in the decoding cycles
    peak_memory_gb: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def acceptance(self) -> float:
        return self.kept / self.drafted if self.drafted else 0.0

    @property
    def mean_g(self) -> float:
        return self.drafted / self.cycles if self.cycles else 0.0

    def to_dict(self) -> Dict:
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}
        out.update(prompt_tps=self.prompt_tps, generation_tps=self.generation_tps, acceptance=self.acceptance)
        return out


@dataclass
class _Cycle:
    g: int  # guesses verified
    source: str  # who made them
    kept: mx.array
    tokens: mx.array
    hidden: mx.array
    reports: Dict[str, mx.array]

    def arrays(self) -> list:
        return [self.kept, self.tokens, self.hidden, *self.reports.values()]


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
        if drafter is not None and not isinstance(drafter, Drafter):
            raise SettingsError(f"drafter {drafter!r} has no draft(context, g) method")
        self.target = target
        self.settings = settings
        self.drafter = drafter
        self.draft_tokens = 0 if drafter is None else draft_tokens
        self.policy = None
        if self.draft_tokens is None:
            self.policy = AdaptiveDraftLength(ADAPTIVE_MAX_G)
        self.report = report
        self.stop_tokens = set(stop_tokens)
        self.prefill_chunk = prefill_chunk
        self.uniforms = uniform_streams(settings.seed)
        self.stats = Stats()

    def check_room(self, state: SequenceState, new_tokens: int, max_tokens: int) -> None:
        limit = self.target.args.max_position_embeddings
        total = len(state.tokens) + new_tokens + max_tokens
        if total > limit:
            raise SettingsError(
                f"prompt too long: {len(state.tokens) + new_tokens} tokens plus {max_tokens} to "
                f"generate exceed the model's {limit} positions"
            )

    def start(self, state: SequenceState, tokens: List[int], max_tokens: int) -> None:
        """Make `state` hold the prompt `tokens`, ready to generate: it goes back to the longest
        prefix it shares with them (see `SequenceState.rewind`), the rest goes through the
        target, and the point is checkpointed for the next turn to come back to."""
        held = state.rewind(tokens)
        self.check_room(state, len(tokens) - held, max_tokens)
        self.add_tokens(state, tokens[held:])
        state.checkpoint()

    def add_tokens(self, state: SequenceState, tokens: List[int]) -> None:
        """Append prompt tokens: all but the last go through the target now (in chunks). The
        tokens generated after them are a new answer (its uniforms start again at index 0)."""
        if not tokens:
            raise SettingsError("the prompt is empty")
        vocab = self.target.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise SettingsError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        start = time.perf_counter()
        self.stats.prompt_reused += state.cached
        to_process = state.tokens[-1:] + tokens[:-1]
        state.tokens.extend(tokens)
        state.generated = 0
        if to_process:
            state.hidden = prefill(self.target, mx.array([to_process]), state.cache, self.prefill_chunk)
            mx.eval(state.hidden)
        self.stats.prompt_tokens += len(to_process)
        self.stats.prompt_seconds += time.perf_counter() - start

    def generate(self, state: SequenceState, max_tokens: int) -> Iterator[TokenReport]:
        """Yield the reports of up to `max_tokens` new tokens as they settle."""
        if max_tokens < 0:
            raise SettingsError(f"max_tokens must be >= 0, got {max_tokens}")
        start = last_settled = time.perf_counter()
        produced, pending, in_flight, planned = 0, _Pending(), None, None
        try:
            while produced < max_tokens:
                if in_flight is None:
                    g = planned if planned is not None else self._choose_g(max_tokens - produced)
                    in_flight = self._build_cycle(state, g)
                mx.async_eval(in_flight.arrays())
                ahead, planned = None, None
                if in_flight.g == 0 and produced + 1 < max_tokens:
                    planned = self._choose_g(max_tokens - produced - 1)
                    if planned == 0:
                        # No drafts: the next input is this cycle's token, known to the device;
                        # queue the next pass before this one's sync, as mlx-lm's loop does.
                        ahead = self._build_cycle(state, 0, last=in_flight.tokens[None, :1], t0=state.generated + 1)
                        mx.async_eval(ahead.arrays())
                        planned = None
                yield from pending.hand_over()  # while the device works on this cycle
                current, in_flight = in_flight, ahead
                hidden_before = state.hidden
                reports, stop = self._settle(state, current, max_tokens - produced)
                pending = _Pending(reports, hidden_before, current.hidden)
                produced += len(reports)
                now = time.perf_counter()
                if self.policy is not None:
                    self.policy.observe(current.g, sum(r.drafted for r in reports), now - last_settled)
                last_settled = now
                if stop:
                    break
            yield from pending.hand_over()
        finally:
            # However it ends (done, a stop, the caller leaving early, an error), the state must
            # hold exactly the tokens handed over: drop the rest, and every queued position.
            self._unsettle(state, pending)
            excess = state.cached - (len(state.tokens) - 1)
            if excess > 0:
                trim_cache(state.cache, excess)
            self.stats.generation_seconds += time.perf_counter() - start
            self.stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    def _choose_g(self, budget: int) -> int:
        """Guesses for a cycle that may settle at most `budget` tokens."""
        if self.policy is not None:
            return self.policy.choose(budget)
        return min(self.draft_tokens, budget - 1)

    def _unsettle(self, state: SequenceState, pending: "_Pending") -> None:
        """Take back the settled tokens that were never handed over."""
        unsent = len(pending.reports) - pending.sent
        if unsent <= 0:
            return
        kept = pending.sent
        del state.tokens[-unsent:]
        state.generated -= unsent
        state.hidden = pending.hidden_before if kept == 0 else pending.hidden[:, kept - 1 : kept]
        self.stats.generated_tokens -= unsent

    def _build_cycle(self, state: SequenceState, g: int, last: Optional[mx.array] = None, t0: Optional[int] = None) -> _Cycle:
        """The lazy graph of one cycle: draft g, verify g + 1 positions, accept, report.

        last: the input token [1, 1] when it is still on the device (default: the last settled
        token); t0: the output index of the cycle's first token (default: the next one).
        """
        if state.hidden is None:
            g = 0  # nothing in the caches yet for a drafter to read
        if last is None:
            last = mx.array([state.tokens[-1:]], dtype=mx.int32)
        t0 = state.generated if t0 is None else t0
        draft = self._draft(state, last, g) if g > 0 else Draft(mx.zeros((0,), mx.int32), source="none")
        g = draft.tokens.shape[0]  # a drafter may propose fewer than asked
        inputs = mx.concatenate([last, draft.tokens[None]], axis=1)
        logits, hidden = self.target(inputs, state.cache)
        dist = distribution(logits[0], self.settings)
        if draft.q is None:
            kept, tokens = accept_by_match(dist, draft.tokens, self.uniforms["target"].take(t0, g + 1))
        else:
            kept, tokens = accept_by_ratio(
                dist,
                draft.tokens,
                draft.q,
                self.uniforms["accept"].take(t0, g)[:, 0],
                self.uniforms["residual"].take(t0, g),
                self.uniforms["target"].take(t0 + g, 1)[0],
            )
        reports = report_arrays(logits[0], dist, tokens) if self.report else {}
        return _Cycle(g, draft.source, kept, tokens, hidden, reports)

    def _draft(self, state: SequenceState, last: mx.array, g: int) -> Draft:
        context = DraftContext(
            tokens=state.tokens,
            last_token=last,
            hidden=state.hidden,
            shared_kv=self.target.drafter_kv(state.cache),
            settings=self.settings,
            uniforms=self.uniforms["draft"].take(state.generated, g),
        )
        draft = self.drafter.draft(context, g)
        n = draft.tokens.shape[0] if draft.tokens.ndim == 1 else -1
        if not 0 <= n <= g or not mx.issubdtype(draft.tokens.dtype, mx.integer):
            raise SettingsError(f"drafter returned guesses {draft.tokens.shape} {draft.tokens.dtype}, expected up to {g} integers")
        if draft.q is not None and draft.q.shape != (n, self.target.vocab_size):
            raise SettingsError(f"drafter returned q of shape {draft.q.shape}, expected ({n}, {self.target.vocab_size})")
        return draft

    def _settle(self, state: SequenceState, cycle: _Cycle, budget: int):
        """The cycle's one host synchronisation; then cut the caches to the emitted tokens."""
        mx.eval(cycle.arrays())
        self.stats.host_syncs += 1
        kept = cycle.kept.item()
        tokens = cycle.tokens.tolist()[: kept + 1][:budget]
        stop = False
        for i, token in enumerate(tokens):
            if token in self.stop_tokens:
                tokens, stop = tokens[: i + 1], True
                break
        n = len(tokens)
        fetched = {k: v.tolist() for k, v in cycle.reports.items()}
        reports = build_reports(fetched, tokens, [i < kept for i in range(n)], self.stats.cycles)
        # The caches hold the last settled token and g guesses; keep it and the n - 1 emitted guesses.
        trim_cache(state.cache, cycle.g + 1 - n)
        state.hidden = cycle.hidden[:, n - 1 : n]
        state.tokens.extend(tokens)
        state.generated += n
        self._count(cycle, min(kept, n), n)
        return reports, stop

    def _count(self, cycle: _Cycle, kept: int, emitted: int) -> None:
        s, g = self.stats, cycle.g
        s.cycles += 1
        s.drafted += g
        s.kept += kept
        s.generated_tokens += emitted
        s.cycles_by_g[g] = s.cycles_by_g.get(g, 0) + 1
        if g:
            s.drafted_by_source[cycle.source] = s.drafted_by_source.get(cycle.source, 0) + g
            s.kept_by_source[cycle.source] = s.kept_by_source.get(cycle.source, 0) + kept
        if len(s.kept_by_position) < g:
            s.kept_by_position += [0] * (g - len(s.kept_by_position))
        for i in range(kept):
            s.kept_by_position[i] += 1
