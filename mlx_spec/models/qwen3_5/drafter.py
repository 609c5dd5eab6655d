"""Qwen3.5's MTP layer as the loop's draft model (models/protocol.py: `DraftModel`), driven by
drafting/mtp.py as Gemma 4's assistant is.

Its K/V of the settled positions are written by the target's own passes (target.py, MTPCache);
a draft round reads them, and carries its own steps' keys and values from step to step (the
`carry`): step i is the pair (hidden, token) at position P - 1 + i, P the last settled token's,
and attends to every settled pair and to the round's earlier steps. Those are never written to
the cache: the next pass writes the true pairs of what it kept.
"""

from typing import Dict, Tuple

import mlx.core as mx

from ..protocol import SharedKV
from .mtp import MTPLayer
from .target import MTP


class MTPDraft:
    def __init__(self, layer: MTPLayer):
        self.layer = layer
        self.target = None  # the target whose embedding and head it shares (`join`)

    def parameters(self) -> dict:
        """Its own weights: the MTP layer's (the embedding and head it uses are the target's)."""
        return self.layer.parameters()

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def kv_inputs(self, kv: Dict[str, SharedKV]) -> Tuple[mx.array, ...]:
        """The MTP layer's whole K/V buffers and the mask of its settled slots."""
        mtp = kv[MTP]
        return mtp.keys, mtp.values, mtp.mask()

    def carry(self, hidden: mx.array, kv: Tuple[mx.array, ...], steps: int) -> tuple:
        """What the round's first step takes: the target's hidden state [B, 1, H], room for the
        round's own keys and values (`steps`, rounded up to a power of two: a compiled step is
        traced for a few lengths of room, not for every draft length), and the step's index."""
        keys, slots = kv[0], 1 << max(0, steps - 1).bit_length()
        room = mx.zeros((hidden.shape[0], keys.shape[1], slots, keys.shape[3]), keys.dtype)
        return hidden, room, room, mx.array(0, mx.int32)

    def step(self, token_embedding: mx.array, carry: tuple, kv: Tuple[mx.array, ...], position) -> Tuple[mx.array, tuple]:
        """One draft step: (its output after mtp.norm, for the head; the next step's carry, whose
        hidden state is that output). `position`: the last settled token's, [B] or a scalar."""
        hidden, own_keys, own_values, index = carry
        cache_keys, cache_values, cache_mask = kv
        layer = self.layer.layers[0]
        attention = layer.self_attn
        x = self.layer.fc(mx.concatenate([self.layer.pre_fc_norm_embedding(token_embedding),
                                          self.layer.pre_fc_norm_hidden(hidden)], axis=-1))
        normed = layer.input_layernorm(x)
        B = x.shape[0]
        queries, gate = mx.split(attention.q_proj(normed).reshape(B, 1, attention.num_attention_heads, -1), 2, axis=-1)
        queries = attention.q_norm(queries).transpose(0, 2, 1, 3)
        keys = attention.k_norm(attention.k_proj(normed).reshape(B, 1, attention.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
        values = attention.v_proj(normed).reshape(B, 1, attention.num_key_value_heads, -1).transpose(0, 2, 1, 3)
        at = position - 1 + index
        queries, keys = attention.rope(queries, offset=at), attention.rope(keys, offset=at)
        slots = mx.arange(own_keys.shape[2])
        mine = (slots == index)[None, None, :, None]
        own_keys = mx.where(mine, keys.astype(own_keys.dtype), own_keys)
        own_values = mx.where(mine, values.astype(own_values.dtype), own_values)
        out = _attend(queries * attention.scale, (cache_keys, cache_values, cache_mask),
                      (own_keys, own_values, (slots <= index)[None, None, None]))
        out = attention.o_proj(out.transpose(0, 2, 1, 3).reshape(B, 1, -1) * mx.sigmoid(gate.reshape(B, 1, -1)))
        h = x + out
        h = self.layer.norm(h + layer.mlp(layer.post_attention_layernorm(h)))
        return h, (h, own_keys, own_values, index + 1)

    def greedy_token(self, h: mx.array) -> mx.array:
        return mx.argmax(self.target.logits(h), axis=-1)  # (argmax: the first of equals, the lowest id)

    def full_logits(self, h: mx.array) -> mx.array:
        return self.target.logits(h)


def _attend(queries: mx.array, *parts: Tuple[mx.array, mx.array, mx.array]) -> mx.array:
    """One query per row [B, Hq, 1, D] (scaled) over several K/V buffers [B, Hkv, n, D], each
    with its mask of the slots read ([B or 1, 1, 1, n]), as one softmax over all of them. The
    cache's buffer is read where it is: joined to the round's own K/V it would be copied whole
    at every draft step."""
    B, heads, _, D = queries.shape
    kv_heads = parts[0][0].shape[1]
    grouped = queries.reshape(B, kv_heads, heads // kv_heads, D)  # the query heads each K/V head serves
    scores = [mx.where(mask, (grouped @ keys.swapaxes(-1, -2)).astype(mx.float32), -mx.inf) for keys, _, mask in parts]
    weights = mx.softmax(mx.concatenate(scores, axis=-1), axis=-1)
    out, start = 0, 0
    for (_, values, _), part in zip(parts, scores):
        n = part.shape[-1]
        out = out + weights[..., start:start + n].astype(values.dtype) @ values
        start += n
    return out.reshape(B, heads, 1, D)
