"""Qwen3.5's MTP layer: a draft position from the target's hidden state and the next token.

    h = fc(concat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])
    out = norm(layer(h))            logits = the target's head (out)

h_t is the target's hidden state after its final norm, the embedding comes first, and for a
deeper draft the next step's h_t is this step's `out` (vLLM's qwen3_5_mtp.py, mlx-vlm's drafter
and llama.cpp agree). The layer is a full-attention decoder layer of the target's kind (gated
attention, q/k norms, partial RoPE; a mixture of experts in the MoE) with K/V of its own: the
pair (h_t, x_{t+1}) sits at position t.
"""

from typing import Any, Dict, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

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


def sanitize(weights: Dict[str, mx.array], hugging_face_layout: bool) -> Dict[str, mx.array]:
    """The `mtp.` weights of a target checkpoint as MTPLayer names them: the MoE's fused experts
    split as mlx-lm splits the target's, and the norms shifted where the checkpoint is in Hugging
    Face's layout (an MLX conversion that kept them has them shifted already)."""
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
        if hugging_face_layout and value.ndim == 1 and (key == "norm.weight" or key.endswith(SHIFTED_NORMS)):
            value = value + 1.0
        out[key] = value
    return out
