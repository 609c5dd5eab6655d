"""The Qwen3.5 target: mlx-lm's own network, opened up for speculative decoding.

A sequence's own caches (prefill) are mlx-lm's pass over our caches: `FullCache` on the full-
attention layers, `RecurrentCache` on the Gated DeltaNet layers. The loop's pass over a batch's
rows (`forward_batch`) is compiled, as Gemma 4's is (models/batch_pass.py): the full-attention
layers read and write the storage's whole buffers through masks, and each Gated DeltaNet layer
first replays what its row kept of the last pass, then runs this pass's positions (recurrent.py).
"""

from typing import Dict, Optional, Sequence, Tuple

import mlx.core as mx

from ...media.items import MediaSpan, chunk_bounds
from ..batch_pass import MAX_POSITIONS, RowsCache
from ..cache import FullCache
from ..traces import TraceCache, shapes_of
from .recurrent import RecurrentCache, Stash, replay, run_layer
from .storage import RECURRENT, HybridCaches


class Target:
    def __init__(self, model):
        self.model = model
        self.lm = model.language_model
        self.text_model = self.lm.model
        self.args = self.lm.args
        self.traces = TraceCache()
        self._weights_ready = False

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def context_length(self) -> int:
        return self.args.max_position_embeddings

    @property
    def kinds(self) -> list:
        return [RECURRENT if layer.is_linear else None for layer in self.text_model.layers]

    def make_cache(self, max_trim: int) -> list:
        return [RecurrentCache() if layer.is_linear else FullCache() for layer in self.text_model.layers]

    def hidden(self, tokens: mx.array, cache: list) -> mx.array:
        """Hidden states after the final norm [B, L, H] of `tokens`, appended to `cache`."""
        return self.text_model(tokens, cache=cache)

    def logits(self, hidden: mx.array) -> mx.array:
        if self.args.tie_word_embeddings:
            return self.text_model.embed_tokens.as_linear(hidden)
        return self.lm.lm_head(hidden)

    def forward(self, tokens: mx.array, cache: list) -> Tuple[mx.array, mx.array]:
        hidden = self.hidden(tokens, cache)
        return self.logits(hidden), hidden

    def embed(self, tokens: mx.array) -> mx.array:
        return self.text_model.embed_tokens(tokens)

    def prefill(self, tokens: mx.array, cache: list, chunk: int, spans: Sequence[MediaSpan] = (), start: int = 0) -> mx.array:
        """Feed `tokens` [1, L] in chunks; the hidden state [1, 1, H] of the last position."""
        if spans:
            raise ValueError("this Qwen3.5 target reads text only")
        hidden = None
        for lo, hi in chunk_bounds(tokens.shape[1], chunk, (), start):
            if hidden is not None:
                mx.eval([a for c in cache for a in _arrays(c)])
            hidden = self.hidden(tokens[:, lo:hi], cache)
        return hidden[:, -1:]

    def batch_caches(self, max_trim: int, max_pass: int) -> HybridCaches:
        linear = [layer.linear_attn for layer in self.text_model.layers if layer.is_linear]
        return HybridCaches(self.kinds, linear, max_trim, max_pass)

    def forward_batch(self, tokens: mx.array, caches: HybridCaches, offsets: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) of every row's tokens [B, L], each row at its own offset, compiled."""
        if tokens.shape[0] != len(caches) or tokens.shape[1] > MAX_POSITIONS:
            raise ValueError(f"a batch pass takes one row per sequence and at most {MAX_POSITIONS} positions, "
                             f"got {tokens.shape} for {len(caches)} rows")
        n = tokens.shape[1]
        caches.reserve(n)
        if not self._weights_ready:
            mx.eval(self.model.parameters())  # constants of the trace: evaluated first
            self._weights_ready = True
        offsets = caches.device_offsets() if offsets is None else offsets
        kv = [b for k, v in zip(caches.keys, caches.values) for b in (k, v)]
        inputs = [tokens.astype(mx.int32), offsets, caches.began, *kv, *caches.recurrent_buffers]
        function = self.traces.get(("qwen-pass", shapes_of(inputs)), lambda: self._pass(len(kv) // 2))
        logits, hidden, *out = function(*inputs)
        kv_out, recurrent = out[: len(kv)], out[len(kv):]
        r = len(caches.layers)
        stashes = [Stash(*recurrent[2 * r + 3 * i : 2 * r + 3 * i + 3]) for i in range(r)]
        caches.passed(recurrent[:r], recurrent[r : 2 * r], stashes, offsets)
        caches.written(kv_out[0::2], kv_out[1::2], n)
        return logits, hidden

    def _pass(self, attention_layers: int):
        layers = self.text_model.layers

        def run(tokens, offsets, began, *buffers):
            kv, recurrent = buffers[: 2 * attention_layers], buffers[2 * attention_layers:]
            r = len(recurrent) // 5
            windows, states = recurrent[:r], recurrent[r : 2 * r]
            stashes = [Stash(*recurrent[2 * r + 3 * i : 2 * r + 3 * i + 3]) for i in range(r)]
            rows = [RowsCache(kv[2 * i], kv[2 * i + 1], offsets, None, None) for i in range(attention_layers)]
            kept = offsets - began
            x = self.text_model.embed_tokens(tokens)
            mask = rows[0].make_mask(tokens.shape[1]) if rows else None
            new_windows, new_states, new_stashes = [], [], []
            attention, linear = iter(rows), iter(range(r))
            for layer in layers:
                if not layer.is_linear:
                    x = layer(x, mask=mask, cache=next(attention))
                    continue
                i = next(linear)
                window, state = replay(layer.linear_attn, windows[i], states[i], stashes[i], kept)
                out, stash = run_layer(layer.linear_attn, layer.input_layernorm(x), window, state)
                h = x + out
                x = h + layer.mlp(layer.post_attention_layernorm(h))
                new_windows.append(window)
                new_states.append(state)
                new_stashes.extend(stash)
            hidden = self.text_model.norm(x)
            return [self.logits(hidden), hidden, *(b for c in rows for b in (c.keys, c.values)),
                    *new_windows, *new_states, *new_stashes]

        return run

    def batch_drafter_buffers(self, caches, end=None) -> Dict:
        return {}  # its MTP layer keeps K/V of its own (mtp.py), no drafter reads the target's

    def drafter_buffers(self, cache: list) -> Dict:
        return {}


def _arrays(cache) -> list:
    if isinstance(cache, RecurrentCache):
        return [a for a in cache.cache if a is not None]
    return [a for a in (cache.keys, cache.values) if a is not None]
