"""The Qwen3.5 target: mlx-lm's own network, opened up for speculative decoding.

A sequence's own caches (prefill) are mlx-lm's pass over our caches: `FullCache` on the full-
attention layers, `RecurrentCache` on the Gated DeltaNet layers. The loop's pass over a batch's
rows (`forward_batch`) is compiled, as Gemma 4's is (models/batch_pass.py): the full-attention
layers read and write the storage's whole buffers through masks, and each Gated DeltaNet layer
first replays what its row kept of the last pass, then runs this pass's positions (recurrent.py).
"""

from typing import Dict, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.base import gather_last_axis

from ...media.items import MediaSpan, chunk_bounds
from ..batch_pass import RowsCache, check_rows
from ..cache import FullCache
from ..traces import TraceCache, shapes_of
from ..protocol import SharedKV
from .mtp import MTPCache, MTPLayer, pair_keys_values
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
        # The MTP layer, once a drafter drafts with it (`join`): every pass then writes its K/V.
        self.mtp: Optional[MTPLayer] = None

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
        own = [RecurrentCache() if layer.is_linear else FullCache() for layer in self.text_model.layers]
        return own + ([MTPCache()] if self.mtp is not None else [])

    def hidden(self, tokens: mx.array, cache: list) -> mx.array:
        """Hidden states after the final norm [B, L, H] of `tokens`, appended to `cache` (and
        with an MTP layer, its K/V of the pairs these positions complete: see MTPCache)."""
        if self.mtp is None:
            return self.text_model(tokens, cache=cache)
        mtp_cache, start = cache[-1], cache[-1].offset
        hidden = self.text_model(tokens, cache=cache[:-1])
        pairs = mx.concatenate([mtp_cache.hidden_before(start, hidden), hidden[:, :-1]], axis=1)
        mtp_cache.update_and_fetch(*pair_keys_values(self.mtp, self.embed(tokens), pairs, start - 1))
        mtp_cache.keep_passed(hidden, start)
        return hidden

    def logits(self, hidden: mx.array) -> mx.array:
        if self.args.tie_word_embeddings:
            return self.text_model.embed_tokens.as_linear(hidden)
        out = self.lm.lm_head(hidden)
        group = getattr(self.lm, "sharding_group", None)  # split over a group: each rank's slice of the vocabulary
        return out if group is None else gather_last_axis(out, group)

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
        mtp = self.mtp is not None  # its K/V: one more full-attention layer, last
        return HybridCaches(self.kinds + ([None] if mtp else []), linear, max_trim, max_pass,
                            self.hidden_size if mtp else None)

    def forward_batch(self, tokens: mx.array, caches: HybridCaches, offsets: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) of every row's tokens [B, L], each row at its own offset, compiled."""
        check_rows(tokens, caches)
        n = tokens.shape[1]
        caches.reserve(n)
        if not self._weights_ready:
            mx.eval(self.model.parameters())  # constants of the trace: evaluated first
            self._weights_ready = True
        offsets = caches.device_offsets() if offsets is None else offsets
        kv = [b for k, v in zip(caches.keys, caches.values) for b in (k, v)]
        mtp = [caches.before] if caches.mtp else []
        inputs = [tokens.astype(mx.int32), offsets, caches.began, *kv, *caches.recurrent_buffers, *mtp]
        function = self.traces.get(("qwen-pass", shapes_of(inputs)), lambda: self._pass(len(kv) // 2, caches.mtp))
        logits, hidden, *out = function(*inputs)
        kv_out, recurrent = out[: len(kv)], out[len(kv):]
        before = recurrent.pop() if caches.mtp else None
        r = len(caches.layers)
        stashes = [Stash(*recurrent[2 * r + 3 * i : 2 * r + 3 * i + 3]) for i in range(r)]
        caches.passed(recurrent[:r], recurrent[r : 2 * r], stashes, offsets, before)
        caches.written(kv_out[0::2], kv_out[1::2], n)
        return logits, hidden

    def _pass(self, attention_layers: int, mtp: bool):
        layers = self.text_model.layers

        def run(tokens, offsets, began, *buffers):
            kv, recurrent = buffers[: 2 * attention_layers], buffers[2 * attention_layers:]
            recurrent, before = (recurrent[:-1], recurrent[-1]) if mtp else (recurrent, None)
            r = len(recurrent) // 5
            windows, states = recurrent[:r], recurrent[r : 2 * r]
            stashes = [Stash(*recurrent[2 * r + 3 * i : 2 * r + 3 * i + 3]) for i in range(r)]
            rows = [RowsCache(kv[2 * i], kv[2 * i + 1], offsets, None, None) for i in range(attention_layers)]
            kept = offsets - began
            x = embedded = self.text_model.embed_tokens(tokens)
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
            out = [self.logits(hidden), hidden]
            if mtp:  # the MTP layer's K/V of the pairs this pass completes, in its rows (last)
                incoming = mx.take_along_axis(before, kept[:, None, None], axis=1)
                pairs = mx.concatenate([incoming, hidden[:, :-1]], axis=1)
                rows[-1].update_and_fetch(*pair_keys_values(self.mtp, embedded, pairs, offsets - 1))
                new_stashes.append(mx.concatenate([incoming, hidden], axis=1))
            return [*out, *(b for c in rows for b in (c.keys, c.values)), *new_windows, *new_states, *new_stashes]

        return run

    def batch_drafter_buffers(self, caches: HybridCaches, end: Optional[mx.array] = None) -> Dict[str, SharedKV]:
        """The MTP layer's K/V in every row of the storage (its last attention layer), slots
        1 .. end - 1: the pairs of every settled position (empty without an MTP layer)."""
        if not caches.mtp:
            return {}
        end = caches.device_offsets() if end is None else end
        keys, values = caches.keys[-1], caches.values[-1]
        return {MTP: SharedKV(keys, values, mx.ones_like(end), end, mx.arange(keys.shape[2])[None])}

    def drafter_buffers(self, cache: list) -> Dict[str, SharedKV]:
        """The MTP layer's K/V in a sequence's own caches (MTPCache), every settled pair."""
        if self.mtp is None:
            return {}
        own = cache[-1]
        if own.keys is None:
            raise ValueError("the target has processed no tokens yet: prefill first")
        return {MTP: SharedKV(own.keys, own.values, 1, own.offset)}


MTP = "mtp"  # the drafter's K/V by name (models/protocol.py: SharedKV)


def _arrays(cache) -> list:
    if isinstance(cache, RecurrentCache):
        return [a for a in cache.cache if a is not None]
    return [a for a in (cache.keys, cache.values) if a is not None]
