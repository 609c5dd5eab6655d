"""Qwen3.5's MTP layer: a draft position from the target's hidden state and the next token.

    h = fc(concat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])
    out = norm(layer(h))            logits = the target's head (out)

h_t is the target's hidden state after its final norm, the embedding comes first, and for a
deeper draft the next step's h_t is this step's `out` (vLLM's qwen3_5_mtp.py, mlx-vlm's drafter
and llama.cpp agree). The layer is a full-attention decoder layer of the target's kind (gated
attention, q/k norms, partial RoPE; a mixture of experts in the MoE) with K/V of its own: the
pair (h_t, x_{t+1}) sits at position t.
"""

from typing import Any, Dict, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

from ..cache import FullCache

# Every norm of the layer is Qwen3.5's (1 + w) kind; MLX's RMSNorm scales by w alone, so a
# checkpoint as Hugging Face holds it is shifted once on load (as mlx-lm does the target's).
SHIFTED_NORMS = ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


class MTPLayer(nn.Module):
    def __init__(self, args: TextModelArgs):
        super().__init__()
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=eps)
        # mlx-lm's decoder layer attends fully where (index + 1) is a multiple of the interval.
        self.layers = [DecoderLayer(args, layer_idx=args.full_attention_interval - 1)]
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def __call__(self, next_embeddings: mx.array, hidden: mx.array, cache: Optional[Any] = None) -> mx.array:
        """The layer's output after its norm [B, L, H], for positions whose next tokens'
        embeddings and target hidden states are given, appended to `cache` (its own K/V)."""
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(next_embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1))
        x = self.layers[0](x, mask=create_attention_mask(x, cache), cache=cache)
        return self.norm(x)


def pair_keys_values(layer: MTPLayer, next_embeddings: mx.array, hidden: mx.array,
                     positions: Union[int, mx.array]) -> Tuple[mx.array, mx.array]:
    """The MTP layer's keys and values [B, Hkv, L, D] of pairs (hidden state at t, embedding of
    token t + 1) at positions t from `positions` (each row's own where an array [B]): what its
    attention writes to its cache, without the rest of the layer (only the K/V are kept of a
    verified position; the draft step computes its own)."""
    x = layer.fc(mx.concatenate([layer.pre_fc_norm_embedding(next_embeddings), layer.pre_fc_norm_hidden(hidden)], axis=-1))
    decoder = layer.layers[0]
    attention, x = decoder.self_attn, decoder.input_layernorm(x)
    B, L, _ = x.shape
    keys = attention.k_norm(attention.k_proj(x).reshape(B, L, attention.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
    values = attention.v_proj(x).reshape(B, L, attention.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    return attention.rope(keys, offset=positions), values


class MTPCache(FullCache):
    """The MTP layer's K/V in a sequence's own caches, one slot per target position: slot s holds
    the pair (h_{s-1}, x_s), whose position is s - 1 (slot 0 has no hidden state before it and
    is never read). Shifted so, it trims and grows with the target's layers, position for
    position. It keeps the target's hidden states of its last pass too: the next pass's first
    pair is the hidden state before it with that pass's first token."""

    KEEP = 64  # hidden states kept of a pass: further back than any trim goes

    def __init__(self):
        super().__init__()
        self.passed: Optional[mx.array] = None  # [1, n, H]: the hidden states at began, began + 1, ...
        self.began = 0

    def hidden_before(self, offset: int, like: mx.array) -> mx.array:
        """The target's hidden state at position offset - 1 [1, 1, H] (zeros where not kept: a
        rewind past the last pass costs that one pair's accuracy, never a token)."""
        j = offset - 1 - self.began
        if self.passed is None or not 0 <= j < self.passed.shape[1]:
            return mx.zeros((like.shape[0], 1, like.shape[-1]), like.dtype)
        return self.passed[:, j : j + 1]

    def keep_passed(self, hidden: mx.array, began: int) -> None:
        kept = min(hidden.shape[1], self.KEEP)
        self.passed, self.began = hidden[:, -kept:], began + hidden.shape[1] - kept

    # A mark keeps the hidden states as they were (the K/V's older slots never change).
    def snapshot(self) -> tuple:
        return self.passed, None, self.began, self.offset

    def restore(self, snapshot: tuple) -> None:
        self.passed, _, self.began, offset = snapshot
        self.trim(self.offset - offset)

    def lowest_reachable(self) -> int:
        return 0

    def trimmable_to(self, offset: int) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        return super().nbytes + (self.passed.nbytes if self.passed is not None else 0)


def sanitize(weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
    """The `mtp.` weights of a target checkpoint as MTPLayer names them: the MoE's fused experts
    split as mlx-lm splits the target's, and each norm shifted to (1 + w) where its weights read
    unshifted. Its values say which, not the checkpoint's layout: Hugging Face's holds w (near 0
    when trained), mlx-lm's own conversions 1 + w (near 1), and third-party scripts that add the
    MTP layer to an MLX conversion hold either. A shift missed reads as no acceptance at all,
    one applied twice as lower acceptance: neither as a wrong token."""
    out = {}
    for key, value in weights.items():
        if not key.startswith("mtp."):
            continue
        key = key[len("mtp."):]
        if key.endswith(".experts.gate_up_proj"):
            prefix, middle = key[: -len(".experts.gate_up_proj")], value.shape[-2] // 2
            out[f"{prefix}.switch_mlp.gate_proj.weight"] = value[..., :middle, :]
            out[f"{prefix}.switch_mlp.up_proj.weight"] = value[..., middle:, :]
            continue
        if key.endswith(".experts.down_proj"):
            out[key.replace(".experts.down_proj", ".switch_mlp.down_proj.weight")] = value
            continue
        if value.ndim == 1 and (key == "norm.weight" or key.endswith(SHIFTED_NORMS)) and reads_unshifted(value):
            value = value + 1.0
        out[key] = value
    return out


def reads_unshifted(norm: mx.array) -> bool:
    """Whether a (1 + w) norm's stored weights are w, not 1 + w (their mean below one half)."""
    return float(norm.astype(mx.float32).mean()) < 0.5
