"""A multi-token-prediction assistant as a drafter: g steps at a constant position, each a
compiled function that reads the target's K/V (the assistant keeps no cache of its own). Any
family's draft model that follows models/protocol.py's `DraftModel` drafts through this."""

from typing import Dict, Optional

import mlx.core as mx

from ..models.protocol import DraftModel, SharedKV, TargetModel
from ..sampling.distribution import distribution
from ..sampling.settings import SamplingSettings
from .base import Draft, DraftContext, Drafter
from .pieces import HostWork, run_through


class MTPDrafter(Drafter):
    """An MTP assistant (Gemma 4's, say): g steps at a constant position, reading the target's K/V.

    sample=False (default): argmax guesses, never building full-vocabulary logits.
    sample=True: at temperature > 0, guesses are drawn from the drafter's own distribution
    under the same settings, and their q is returned for the ratio rule.
    It reads only the device-side inputs, so the loop may draft with it ahead of the host.
    """

    drafts_ahead = True
    source = "mtp"

    def __init__(self, assistant: DraftModel, target: TargetModel, sample: bool = False):
        self.assistant = assistant
        self.target = target
        self.sample = sample
        # The compiled draft steps live with the target's other compiled functions (one owner),
        # keyed by this drafter, the sampling settings and the K/V buffer shapes.
        self.traces = target.traces

    def draft(self, context: DraftContext, g: int) -> Draft:
        return run_through(self.draft_steps(context, g))

    def draft_steps(self, context: DraftContext, g: int) -> HostWork:
        """`draft`, yielding after each step."""
        sampled = self.sample and not context.settings.greedy
        token, hidden = context.last_token, context.hidden
        # Held at the last settled token's position for the round, as transformers and Google's
        # runtime do (vLLM and mlx-vlm use one less).
        position = context.device_position
        # The K/V stay the same for every step of the round: their masks are built once.
        kv = self.assistant.kv_inputs(context.kv)
        step = self._step(context.settings if sampled else None, tuple(a.shape for a in kv))
        carry = self.assistant.carry(hidden, kv, g)
        guesses, qs = [], []
        for i in range(g):
            if sampled:
                token, carry, q = step(token, carry, position, context.uniforms[i], *kv)
                qs.append(q)
            else:
                token, carry = step(token, carry, position, *kv)
            guesses.append(token.reshape(1))
            yield
        tokens = mx.concatenate(guesses) if guesses else mx.zeros((0,), mx.int32)  # int32 steps
        return Draft(tokens, mx.stack(qs) if sampled and qs else None, source=self.source, steps=guesses)

    @property
    def batch_group(self) -> "MTPDrafter":
        """The assistant whose steps the rows drafting with it share in a batch (drafting/rows.py)."""
        return self

    def from_batch(self, guesses: mx.array, context: DraftContext) -> Draft:
        """A row's draft from its share of the batch's guesses ([g])."""
        return Draft(guesses, source=self.source)

    def draft_batch_steps(self, last: mx.array, hidden: mx.array, positions: mx.array, kv: Dict[str, SharedKV],
                          g: int) -> HostWork:
        """Argmax guesses for the rows of a batch at once (decoding/batch.py), yielding after
        each step: last tokens [B, 1], hidden states [B, 1, H], positions [B], the batch's K/V
        (each row reads its own, `Target.batch_drafter_buffers`); each step one compiled call
        for every row. Returns (guesses [B, g], each step's tokens [B, 1]): the step is launched
        a draft step at a time (decoding/batch.py)."""
        kv = self.assistant.kv_inputs(kv)
        step = self._step(None, tuple(a.shape for a in kv))
        token, guesses, carry = last.astype(mx.int32), [], self.assistant.carry(hidden, kv, g)
        for _ in range(g):
            token, carry = step(token, carry, positions, *kv)
            guesses.append(token)
            yield
        return (mx.concatenate(guesses, axis=1) if guesses else mx.zeros((last.shape[0], 0), mx.int32)), guesses

    def _step(self, settings: Optional[SamplingSettings], shapes: tuple):
        """One draft step as a compiled function: a few fused kernels instead of hundreds of
        primitives, and a few microseconds of host time instead of a Python trace. Its inputs
        keep their shapes from cycle to cycle (whole cache buffers, masked), so it is traced
        again only when a cache grows its buffer (bounded: see traces.py)."""
        key = None if settings is None else settings.unseeded()
        return self.traces.get(("draft", self, key, shapes), lambda: self._sampled_step(key) if key else self._argmax_step)

    def _layers(self, token, carry, position, kv):
        return self.assistant.step(self.target.embed(token), carry, kv, position)

    def _argmax_step(self, token, carry, position, *kv):
        h, carry = self._layers(token, carry, position, kv)
        # int32, as the first step's input token: one trace serves every step.
        return self.assistant.greedy_token(h).astype(mx.int32), carry

    def _sampled_step(self, settings: SamplingSettings):
        def step(token, carry, position, uniforms, *kv):
            h, carry = self._layers(token, carry, position, kv)
            dist = distribution(self.assistant.full_logits(h)[0, 0], settings)
            token = dist.sample(uniforms).reshape(1, 1).astype(mx.int32)
            return token, carry, dist.dense(self.assistant.vocab_size)

        return step
