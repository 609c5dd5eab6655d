"""Per-token reports: where each generated token stands in the model's distribution.

The figures are computed on the device for every verified position of a cycle, in the same
graph as the tokens, and come back in the cycle's one host synchronisation.
"""

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from ..sampling.distribution import Distribution

TOP = 5


class Waiting:
    """What a reader of a batch row gives when nothing has settled since it last read: the
    batch must step first (decoding/batch.py). The request path passes it through untouched."""

    def __repr__(self) -> str:
        return "WAITING"


WAITING = Waiting()


@dataclass
class TokenReport:
    """One generated token. The distribution figures are None when reports are switched off."""

    token: int
    drafted: bool  # a kept guess, rather than the target's own pick
    cycle: int
    text: Optional[str] = None  # the text it shows, when a tokenizer is loaded ("" for markers)
    channel: str = "answer"  # "answer", "thought" or "tool_call" (see chat_format.Channels)
    raw: Optional[str] = None  # its text as the model wrote it: channel markers and labels kept
    prob: Optional[float] = None  # probability in the model's own distribution (softmax)
    rank: Optional[int] = None  # 1 = the model's most likely token
    sampling_prob: Optional[float] = None  # in the sampling distribution (1.0 when greedy)
    candidates: Optional[int] = None  # tokens left after top-k / top-p (1 when greedy)
    top: List[Tuple[int, float, Optional[str]]] = field(default_factory=list)  # (id, prob, text)

    def to_dict(self) -> Dict:
        out = asdict(self)
        out["top"] = [{"id": i, "prob": p, "text": t} for i, p, t in self.top]
        return out


def report_arrays(logits: mx.array, dist: Distribution, tokens: mx.array) -> Dict[str, mx.array]:
    """Device-side figures for `tokens` [..., P] at positions with `logits` [..., P, V]."""
    logits = logits.astype(mx.float32)
    log_norm = mx.logsumexp(logits, axis=-1, keepdims=True)
    token_logit = mx.take_along_axis(logits, tokens[..., None], axis=-1)
    top = min(TOP, logits.shape[-1])
    top_ids = mx.argpartition(-logits, kth=top - 1, axis=-1)[..., :top]
    top_logits = mx.take_along_axis(logits, top_ids, axis=-1)
    order = mx.argsort(-top_logits, axis=-1)
    return {
        "prob": mx.exp(token_logit - log_norm)[..., 0],
        "rank": (logits > token_logit).sum(axis=-1) + 1,
        "sampling_prob": dist.prob_of(tokens),
        "candidates": dist.count,
        "top_ids": mx.take_along_axis(top_ids, order, axis=-1),
        "top_probs": mx.exp(mx.take_along_axis(top_logits, order, axis=-1) - log_norm),
    }


def build_reports(
    fetched: Dict[str, list], tokens: List[int], drafted: List[bool], cycle: int
) -> List[TokenReport]:
    """Host-side reports for `tokens`, the first positions of fetched `report_arrays` (which
    may be empty when reports are off). Text fields are filled in by whoever has a tokenizer."""
    reports = []
    for i, token in enumerate(tokens):
        report = TokenReport(token=token, drafted=drafted[i], cycle=cycle)
        if fetched:
            report.prob = fetched["prob"][i]
            report.rank = fetched["rank"][i]
            report.sampling_prob = fetched["sampling_prob"][i]
            report.candidates = fetched["candidates"][i]
            report.top = [(t, p, None) for t, p in zip(fetched["top_ids"][i], fetched["top_probs"][i])]
        reports.append(report)
    return reports
