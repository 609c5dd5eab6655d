"""What a Qwen3.5 / Qwen3.6 config.json says about the memory the loop needs: the K/V of its
full-attention layers (and of the MTP layer, which keeps its own), and the Gated DeltaNet layers'
state, which is the same at any context."""

from typing import Any, Mapping, NamedTuple, Optional

from ..batch_pass import MAX_POSITIONS
from .loader import mtp_layers_of, text_config

DEFAULT_FULL_EVERY = 4  # mlx-lm's and transformers' default full_attention_interval


def full_attention_layers(text: Mapping[str, Any]) -> int:
    """How many of the target's layers attend fully (the rest are Gated DeltaNet)."""
    kinds = text.get("layer_types")
    if isinstance(kinds, list):
        return sum(kind == "full_attention" for kind in kinds)
    return int(text["num_hidden_layers"]) // int(text.get("full_attention_interval") or DEFAULT_FULL_EVERY)


def context_of(config: Mapping[str, Any]) -> Optional[int]:
    """The positions the target attends over at most (its text config's max_position_embeddings)."""
    text = text_config(dict(config))
    value = text.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def kv_cache_bytes(config: Mapping[str, Any], context: int, sliding_slack: int) -> Optional[int]:
    """Bytes of a target's caches at `context` tokens: keys and values of every full-attention
    layer and of the MTP layer over the whole context, each Gated DeltaNet layer's convolution
    window and state (float32, as mlx-lm keeps the state), and what a row of the loop keeps to
    roll those back (models/qwen3_5/storage.py): the inputs of its longest pass (MAX_POSITIONS,
    at most) to every such layer, and, with an MTP layer, the target's hidden states of that
    pass. No layer slides, so `sliding_slack` counts nothing.
    None where the config does not say enough."""
    text = text_config(dict(config))
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")
    if not all(isinstance(text.get(k), int) for k in needed):
        return None
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    item = 4 if dtype == "float32" else 2  # bfloat16 unless the checkpoint says float32
    attention = full_attention_layers(text) + mtp_layers_of(text)
    kv = attention * 2 * text["num_key_value_heads"] * head_dim * context * item
    linear, dims = text["num_hidden_layers"] - full_attention_layers(text), LinearDims.of(text)
    conv_dim = 2 * dims.key_dim + dims.value_dim
    conv = (dims.kernel - 1) * conv_dim * item
    state = dims.value_dim * dims.key_head_dim * 4
    stash = MAX_POSITIONS * (conv_dim + 2 * dims.value_heads) * item
    hidden = (MAX_POSITIONS + 1) * text["hidden_size"] * item if mtp_layers_of(text) else 0
    return kv + linear * (conv + state + stash) + hidden


class LinearDims(NamedTuple):
    """A Gated DeltaNet layer's widths from a text config (with mlx-lm's and transformers'
    defaults where the config leaves them out)."""

    key_heads: int
    key_head_dim: int
    value_heads: int
    value_dim: int  # all value heads together
    kernel: int  # the convolution's

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @classmethod
    def of(cls, text: Mapping[str, Any]) -> "LinearDims":
        value_heads = text.get("linear_num_value_heads", 32)
        return cls(text.get("linear_num_key_heads", 16), text.get("linear_key_head_dim", 128), value_heads,
                   value_heads * text.get("linear_value_head_dim", 128), text.get("linear_conv_kernel_dim", 4))
