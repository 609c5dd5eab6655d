"""The end of a cycle after the target pass: the sampling distribution at every verified
position, the acceptance rule and the per-token report figures, as compiled functions.

Uncompiled, these are about a hundred small primitives per cycle, each one a kernel launch and
each one built op by op in Python. Compiled, their element-wise chains fuse and the host replays
a recorded graph. Their shapes depend only on the number of guesses g (and the vocabulary), so
each is traced once per g and settings, and kept with the target's other compiled functions,
shared by every decoder on that target (models/traces.py bounds them).
"""

from typing import Dict, Optional, Tuple

import mlx.core as mx

from ..models.traces import TraceCache, shapes_of
from ..sampling.acceptance import accept_by_match, accept_by_ratio
from ..sampling.distribution import distribution
from ..sampling.masks import restricted
from ..sampling.settings import SamplingSettings
from .reports import report_arrays


class Verifier:
    def __init__(self, settings: SamplingSettings, report: bool, traces: TraceCache):
        """traces: where the compiled functions live (the target's): a new decoder with settings
        seen before traces nothing again."""
        # The seed only picks the uniforms, which are inputs: it is no part of a graph.
        self.settings, self.report, self.traces = settings.unseeded(), report, traces

    @property
    def key(self) -> tuple:
        """What its graphs depend on: verifiers with equal keys verify alike (and may verify
        several sequences' positions in one call: [rows, positions, V])."""
        return self.settings, self.report

    def by_match(self, logits: mx.array, guesses: mx.array, uniforms: mx.array, mask: Optional[mx.array] = None):
        """(kept, tokens, reports) for deterministic guesses (see `sampling.accept_by_match`).
        logits: [..., g + 1, V]; guesses: [..., g]; uniforms: [..., g + 1, 2]; mask: a
        constraint's packed allowed tokens at each position [..., g + 1, words] (sampling/masks.py),
        or None."""
        return self._compiled("match", mask, logits, guesses, uniforms)

    def by_ratio(self, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform, mask=None):
        """(kept, tokens, reports) for guesses sampled from q (see `sampling.accept_by_ratio`)."""
        return self._compiled("ratio", mask, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)

    def _compiled(self, rule: str, mask: Optional[mx.array], *inputs):
        """The rule's compiled graph on `inputs`; with a mask (its last input), the distribution
        is the target's restricted to what the mask allows (the reports' own probability and
        rank stay the target's unrestricted ones)."""
        inputs = inputs if mask is None else (*inputs, mask)
        key = ("verify", rule, mask is not None, self.settings, self.report, shapes_of(inputs))
        graph = _match_graph if rule == "match" else _ratio_graph
        settings, report, masked = self.settings, self.report, mask is not None

        def run(logits, *rest):
            rest, bitmask = (rest[:-1], rest[-1]) if masked else (rest, None)
            allowed = logits if bitmask is None else restricted(logits.astype(mx.float32), bitmask)
            return graph(settings, report, logits, allowed, *rest)

        return self.traces.get(key, lambda: run)(*inputs)


def _match_graph(settings, report, logits, allowed, guesses, uniforms):
    dist = distribution(allowed, settings)
    kept, tokens = accept_by_match(dist, guesses, uniforms)
    return _with_reports(report, logits, dist, kept, tokens)


def _ratio_graph(settings, report, logits, allowed, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform):
    dist = distribution(allowed, settings)
    kept, tokens = accept_by_ratio(dist, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)
    return _with_reports(report, logits, dist, kept, tokens)


def _with_reports(report, logits, dist, kept, tokens) -> Tuple[mx.array, mx.array, Dict[str, mx.array]]:
    return kept, tokens, report_arrays(logits, dist, tokens) if report else {}
