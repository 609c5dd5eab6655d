"""The end of a cycle after the target pass: the sampling distribution at every verified
position, the acceptance rule and the per-token report figures, as compiled functions.

Uncompiled, these are about a hundred small primitives per cycle, each one a kernel launch and
each one built op by op in Python. Compiled, their element-wise chains fuse and the host replays
a recorded graph. Their shapes depend only on the number of guesses g (and the vocabulary), so
each is traced once per g and settings, and kept with the target's other compiled functions,
shared by every decoder on that target (models/traces.py bounds them).
"""

from typing import Dict, Tuple

import mlx.core as mx

from ..models.traces import TraceCache, shapes_of
from ..sampling.acceptance import accept_by_match, accept_by_ratio
from ..sampling.distribution import distribution
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

    def by_match(self, logits: mx.array, guesses: mx.array, uniforms: mx.array):
        """(kept, tokens, reports) for deterministic guesses (see `sampling.accept_by_match`).
        logits: [..., g + 1, V]; guesses: [..., g]; uniforms: [..., g + 1, 2]."""
        return self._compiled("match", logits, guesses, uniforms)

    def by_ratio(self, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform):
        """(kept, tokens, reports) for guesses sampled from q (see `sampling.accept_by_ratio`)."""
        return self._compiled("ratio", logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)

    def _compiled(self, rule: str, *inputs):
        key = ("verify", rule, self.settings, self.report, shapes_of(inputs))
        graph = _match_graph if rule == "match" else _ratio_graph
        settings, report = self.settings, self.report
        return self.traces.get(key, lambda: lambda *arrays: graph(settings, report, *arrays))(*inputs)


def _match_graph(settings, report, logits, guesses, uniforms):
    dist = distribution(logits, settings)
    kept, tokens = accept_by_match(dist, guesses, uniforms)
    return _with_reports(report, logits, dist, kept, tokens)


def _ratio_graph(settings, report, logits, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform):
    dist = distribution(logits, settings)
    kept, tokens = accept_by_ratio(dist, guesses, q, accept_uniforms, residual_uniforms, bonus_uniform)
    return _with_reports(report, logits, dist, kept, tokens)


def _with_reports(report, logits, dist, kept, tokens) -> Tuple[mx.array, mx.array, Dict[str, mx.array]]:
    return kept, tokens, report_arrays(logits, dist, tokens) if report else {}
