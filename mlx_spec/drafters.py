"""The drafter protocol and the MTP assistant drafter.

A drafter is any object with `draft(context, g) -> Draft`. It is called once per cycle, after
the target's caches were cut back to the settled tokens, and returns g guesses for the tokens
that follow `context.tokens`. Its guesses may stay lazy MLX arrays: the engine verifies them in
the same graph, so drafting costs no host synchronisation of its own.

A drafter that samples its guesses returns their distributions `q` (over the whole vocabulary);
the engine then keeps guesses with the min(1, p/q) rule. A drafter that returns no `q` is treated
as deterministic, and guesses are kept while they match the target's own draw. Both are exact.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple, runtime_checkable

import mlx.core as mx

from .assistant import Assistant
from .sampling import SamplingSettings, distribution
from .target import Target


@dataclass
class DraftContext:
    tokens: List[int]  # every settled token, prompt included; the last is not yet in the caches
    last_token: mx.array  # [1, 1], the last settled token (may be lazy)
    hidden: mx.array  # [1, 1, H], the target's final hidden state at the position before it
    shared_kv: Dict[str, Tuple[mx.array, mx.array]]  # the target's K/V (see Target.drafter_kv)
    settings: SamplingSettings
    uniforms: mx.array  # [g, 2], for drafters that sample (see sampling.inverse_cdf)

    @property
    def position(self) -> int:
        """Position of the last settled token."""
        return len(self.tokens) - 1


@dataclass
class Draft:
    tokens: mx.array  # [g] int32
    q: Optional[mx.array] = None  # [g, V] when the guesses were sampled from q


@runtime_checkable
class Drafter(Protocol):
    def draft(self, context: DraftContext, g: int) -> Draft: ...


class MTPDrafter:
    """Gemma 4's MTP assistant: g steps at a constant position, reading the target's K/V.

    sample=False (default): argmax guesses, never building full-vocabulary logits.
    sample=True: at temperature > 0, guesses are drawn from the drafter's own distribution
    under the same settings, and their q is returned for the ratio rule.
    position_offset: 0 is transformers' convention (the last settled token's position);
    -1 is vLLM's and mlx-vlm's.
    """

    def __init__(self, assistant: Assistant, target: Target, sample: bool = False, position_offset: int = 0):
        self.assistant = assistant
        self.target = target
        self.sample = sample
        self.position_offset = position_offset

    def draft(self, context: DraftContext, g: int) -> Draft:
        sampled = self.sample and not context.settings.greedy
        token, hidden = context.last_token, context.hidden
        position = mx.array(context.position + self.position_offset)
        guesses, qs = [], []
        for i in range(g):
            h, hidden = self.assistant.step(self.target.embed(token), hidden, context.shared_kv, position)
            if sampled:
                dist = distribution(self.assistant.full_logits(h)[0, 0], context.settings)
                token = dist.sample(context.uniforms[i])
                qs.append(dist.dense(self.assistant.vocab_size))
                token = token.reshape(1, 1)
            else:
                token = self.assistant.greedy_token(h)
            guesses.append(token.reshape(1))
        tokens = mx.concatenate(guesses).astype(mx.int32) if guesses else mx.zeros((0,), mx.int32)
        return Draft(tokens, mx.stack(qs) if sampled and qs else None)
