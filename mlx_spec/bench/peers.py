"""The other MTP implementation a Mac user would pick instead, run on the same prompts in the
same process: mlx-vlm's Gemma 4 MTP (its `stream_generate` with the assistant as `draft_model`).

mlx-vlm is an optional extra (`pip install "mlx-spec[peers]"`), never a requirement: without it
the tables say how to add the column. It loads its own copy of the target and the assistant from
the same folders as ours (so the run holds both in memory), and is timed as ours and mlx-lm's
are: the tokens after the first round over the time from that round to the last token.
"""

import importlib.metadata
import importlib.util
import time
from typing import List, Optional

import mlx.core as mx

from ..sampling.settings import SamplingSettings
from .runs import rate

MISSING = 'mlx-vlm is not installed: pip install "mlx-spec[peers]" measures its MTP beside ours'
# Guesses per round asked for, as ours in the seed's setup (mlx-vlm's block counts the verified
# token too); its own rule may draft fewer while few are kept.
DRAFTS = 6


def available() -> bool:
    return importlib.util.find_spec("mlx_vlm") is not None


class MlxVlm:
    """mlx-vlm's Gemma 4 and its MTP drafter, loaded from the folders `engine` was loaded from."""

    def __init__(self, engine):
        from mlx_vlm import load
        from mlx_vlm.speculative.drafters import load_drafter

        if engine.target_path is None or engine.drafter_path is None:
            raise ValueError("mlx-vlm needs the pair's checkpoint folders (not random weights)")
        self.model, self.processor = load(str(engine.target_path))
        self.drafter, self.kind = load_drafter(str(engine.drafter_path))
        self.version = importlib.metadata.version("mlx-vlm")

    def run(self, prompt: List[int], settings: SamplingSettings, max_tokens: int, mtp: bool = True) -> dict:
        """One generation: tokens, tok/s and (with MTP) guesses kept of those drafted."""
        from mlx_vlm.generate import stream_generate

        kwargs = dict(input_ids=mx.array([prompt]), max_tokens=max_tokens, temperature=settings.temperature,
                      top_k=settings.top_k or 0, top_p=settings.top_p or 1.0, seed=settings.seed or 0)
        if mtp:
            kwargs.update(draft_model=self.drafter, draft_kind=self.kind, draft_block_size=DRAFTS + 1)
        tokens, times, rounds = [], [], []
        for i, result in enumerate(stream_generate(self.model, self.processor, "", **kwargs)):
            new = _new_tokens(result, len(tokens))
            tokens.extend(new)
            times.extend([time.perf_counter()] * len(new))
            rounds.extend([i] * len(new))
        kept = sum(getattr(self.drafter, "accept_lens", None) or []) if mtp else 0
        drafted = sum(getattr(self.drafter, "draft_lens", None) or []) if mtp else 0
        return {"tokens": tokens, "tps": rate(times, rounds), "kept": kept, "drafted": drafted}


def _new_tokens(result, seen: int) -> List[int]:
    """The tokens a streamed result adds: several at once after a speculative round."""
    ids: Optional[list] = getattr(result, "token_ids", None)
    if ids is not None and len(ids) >= seen:
        return list(ids[seen:])
    return [int(result.token)]



def open_peer(engine, random_weights: bool):
    """(mlx-vlm loaded on the pair, None) or (None, why it is not measured)."""
    if random_weights:
        return None, "mlx-vlm is not measured on random weights (it loads the pair's checkpoint folders)"
    if not available():
        return None, MISSING
    try:
        return MlxVlm(engine), None
    except Exception as e:  # a version of mlx-vlm that cannot load this pair: the table says so
        return None, f"mlx-vlm could not load this pair: {type(e).__name__}: {e}"
