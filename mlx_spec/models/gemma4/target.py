"""The Gemma 4 target: mlx-lm's own model, opened up for speculative decoding.

We do not rewrite the network. mlx-lm's ``gemma4_text`` model already returns the post-final-norm
hidden states from its inner model; this wrapper adds the logits head on chosen positions only,
the scaled input embedding the drafter needs, our trimmable caches, and access to the K/V of the
last non-shared sliding and full layers, which the MTP drafter reads instead of a cache of its own.
"""

from typing import Dict, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gemma4_text import logit_softcap

from ...media.items import MediaSpan, chunk_bounds, inside
from ..batch_cache import BatchCaches, held_positions, sliding_windows
from ..batch_pass import BatchPass, check_rows
from ..cache import FullCache, SlidingWindowCache
from ..protocol import SharedKV
from ..traces import TraceCache
from .facts import FULL, SLIDING, cached_layer_types, kv_source_layers
from .media_prefill import hidden_with_media


class Target:
    """Gemma 4 text model (from mlx-lm) with logits, hidden states and shared K/V."""

    def __init__(self, model: nn.Module, images_attend_both_ways: bool = False):
        self.model = model
        # use_bidirectional_attention "vision": an image's soft tokens see each other both ways
        # on the sliding layers (media/prefill.py).
        self.images_attend_both_ways = images_attend_both_ways
        # The multimodal wrapper (model_type gemma4) holds the text model as `language_model`.
        self.lm = getattr(model, "language_model", model)
        self.text_model = self.lm.model
        self.args = self.lm.args
        self.kv_layers = kv_source_layers(self.args)
        # Every compiled function that runs on this model (its pass, the drafter's steps, the
        # acceptance test): one owner, whose count of traces tells a cycle's build that traced.
        self.traces = TraceCache()
        self._batch_pass = BatchPass(self, self.traces)

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def window(self) -> int:
        return self.args.sliding_window

    @property
    def context_length(self) -> int:
        return self.args.max_position_embeddings

    def make_cache(self, max_trim: int) -> list:
        """Caches for the layers that compute K/V; the sliding ones can drop `max_trim` entries."""
        return [
            SlidingWindowCache(self.window, max_trim) if t == SLIDING else FullCache()
            for t in cached_layer_types(vars(self.args))
        ]

    def hidden(self, tokens: mx.array, cache: list) -> mx.array:
        """Post-final-norm hidden states [B, L, hidden] of `tokens`, appended to `cache`."""
        return self.text_model(tokens, cache=cache)

    def logits(self, hidden: mx.array) -> mx.array:
        """Softcapped logits of the given hidden states (tied or separate head, as mlx-lm does)."""
        if self.lm.tie_word_embeddings:
            out = self.text_model.embed_tokens.as_linear(hidden)
        else:
            out = self.lm.lm_head(hidden)
        if self.lm.final_logit_softcapping is not None:
            out = logit_softcap(self.lm.final_logit_softcapping, out)
        return out

    def __call__(self, tokens: mx.array, cache: list) -> Tuple[mx.array, mx.array]:
        """Logits and hidden states of every position of `tokens`."""
        hidden = self.hidden(tokens, cache)
        return self.logits(hidden), hidden

    def forward(self, tokens: mx.array, cache: list) -> Tuple[mx.array, mx.array]:
        """`self(tokens, cache)`: the plain pass, for a sequence's first cycle before its caches
        hold anything (the loop's steps take `forward_batch`)."""
        return self(tokens, cache)

    def batch_caches(self, max_trim: int, max_pass: int) -> BatchCaches:
        """The K/V storage of sequences decoding together (models/batch_cache.py)."""
        return BatchCaches(sliding_windows(self.make_cache(max_trim)), max_trim, max_pass)

    def forward_batch(self, tokens: mx.array, caches: BatchCaches, offsets: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) of every row's tokens [B, L], each row at its own offset (compiled;
        `offsets`: on the device, for a step built ahead)."""
        check_rows(tokens, caches)
        return self._batch_pass(tokens, caches, offsets)

    def batch_drafter_buffers(self, caches: BatchCaches, end: Optional[mx.array] = None) -> Dict[str, SharedKV]:
        """`drafter_buffers` for every row of a batch: the settled positions of each row, read
        through the positions its slots hold (a ring on the sliding layer). `end`: each row's
        settled positions on the device, for a step built ahead."""
        end = caches.device_offsets() if end is None else end
        i, j = self.kv_layers[SLIDING], self.kv_layers[FULL]
        ring = caches.rings[i]
        full_slots = mx.arange(caches.keys[j].shape[2])[None]
        return {SLIDING: SharedKV(caches.keys[i], caches.values[i], mx.zeros_like(end), end, held_positions(ring, end)),
                FULL: SharedKV(caches.keys[j], caches.values[j], mx.zeros_like(end), end, full_slots)}

    def embed(self, tokens: mx.array) -> mx.array:
        """The scaled input embedding, as the target's first layer sees it."""
        return self.text_model.embed_tokens(tokens) * self.text_model.embed_scale

    def drafter_buffers(self, cache: list) -> Dict[str, SharedKV]:
        """K/V the MTP drafter attends to in a sequence's own caches: the last window + 1
        positions of the sliding source layer and every position of the full source layer, all
        settled. (The loop's steps read `batch_drafter_buffers`.)"""
        sliding = cache[self.kv_layers[SLIDING]]
        full = cache[self.kv_layers[FULL]]
        if full.keys is None:
            raise ValueError("the target has processed no tokens yet: prefill first")
        return {SLIDING: SharedKV(sliding.keys, sliding.values, *sliding.draft_range()),
                FULL: SharedKV(full.keys, full.values, 0, full.offset)}

    def prefill(self, tokens: mx.array, cache: list, chunk: int, spans: Sequence[MediaSpan] = (),
                start: int = 0) -> mx.array:
        """Feed `tokens` [1, L] (absolute positions from `start`) in chunks; return the hidden
        state [1, 1, H] of the last position. Earlier chunks are evaluated for their cache state
        alone (their logits are never built). Media `spans` among the positions put their
        embeddings at their soft tokens, each image within one chunk (see media_prefill.py).

        The last position goes through alone: only its hidden state is read, and evaluated
        for their cache state alone, the chunks before it leave out the layers that write no
        cache (Gemma 4's K/V-shared layers, 20 of E2B's 35), as mlx-lm's prefill does."""
        hidden, alone = None, None
        bounds = list(chunk_bounds(tokens.shape[1], chunk, spans, start))
        lo, hi = bounds[-1] if bounds else (0, 0)
        if hi - lo > 1 and not any(s.start <= start + hi - 1 < s.end for s in spans):
            bounds[-1:] = [(lo, hi - 1), (hi - 1, hi)]
            alone = hi - 1
        for lo, hi in bounds:
            # (The last position's pass reads the chunk before it lazily, in the same evaluation:
            # what that chunk's K/V-shared layers would compute is never asked for.)
            if hidden is not None and lo != alone:
                mx.eval([c.keys for c in cache] + [c.values for c in cache])
            media = inside(spans, start + lo, start + hi)
            if media:
                hidden = hidden_with_media(self, tokens[:, lo:hi], cache, media, start + lo)
            else:
                hidden = self.hidden(tokens[:, lo:hi], cache)
        return hidden[:, -1:]
