"""The end of a cycle after the target pass: the sampling distribution at every verified
position, the acceptance rule and the per-token report figures, as compiled functions.

Uncompiled, these are about a hundred small primitives per cycle, each one a kernel launch and
each one built op by op in Python. Compiled, their element-wise chains fuse and the host replays
a recorded graph. Their shapes depend only on the number of guesses g (and the vocabulary), so
each is traced once per g and never again as the context grows.
"""

from typing import Dict, Tuple

import mlx.core as mx

from .reports import report_arrays
from .sampling import SamplingSettings, accept_by_match, accept_by_ratio, distribution

class Verifier:
    _shared: Dict[tuple, "Verifier"] = {}

    @classmethod
    def shared(cls, settings: SamplingSettings, report: bool) -> "Verifier":
        """One verifier per sampling settings (the seed aside: uniforms are inputs), shared by
        every decoder, so that a new decoder does not trace its graphs again."""
        key = (settings.unseeded(), report)
        if key not in cls._shared:
            cls._shared[key] = cls(*key)
        return cls._shared[key]

    def __init__(self, settings: SamplingSettings, report: bool):
        self.settings, self.report = settings, report
        self._match = mx.compile(self._match_graph)
        self._ratio = mx.compile(self._ratio_graph)

    def by_match(self, logits: mx.array, guesses: mx.array, uniforms: mx.array):
        """(kept, tokens, reports) for deterministic guesses (see `sampling.accept_by_match`).
        logits: [g + 1, V]; guesses: [g]; uniforms: [g + 1, 2]."""
        return self._match(logits, guesses, uniforms)

    def by_ratio(self, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform):
        """(kept, tokens, reports) for guesses sampled from q (see `sampling.accept_by_ratio`)."""
        return self._ratio(logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)

    def _match_graph(self, logits, guesses, uniforms):
        dist = distribution(logits, self.settings)
        kept, tokens = accept_by_match(dist, guesses, uniforms)
        return self._with_reports(logits, dist, kept, tokens)

    def _ratio_graph(self, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform):
        dist = distribution(logits, self.settings)
        kept, tokens = accept_by_ratio(dist, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)
        return self._with_reports(logits, dist, kept, tokens)

    def _with_reports(self, logits, dist, kept, tokens) -> Tuple[mx.array, mx.array, Dict[str, mx.array]]:
        return kept, tokens, report_arrays(logits, dist, tokens) if self.report else {}
