"""The Gemma 4 family by name: which checkpoints `e2b`, `e4b`, `26b-a4b`, `31b` and `12b` mean.

A name picks the 4-bit MLX conversion of the instruction-tuned target and the matching MTP
assistant. Everything the code does with a model still comes from its config; the text configs
here are the published ones (the keys that fix the shapes and the K/V cache), used before a
checkpoint is downloaded (memory estimates) and to build random-weight models of each shape
(bench/). docs/models.md says where each id and config was found.
"""

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ..registry import Size as _Size
from .facts import layer_pattern as _layers


@dataclass(frozen=True)
class Size(_Size):
    """target: the 4-bit MLX conversion (mlx-community); drafter: the MTP assistant
    (mlx-community's bf16 copy of google's)."""

    text: Dict[str, Any] = None  # the published text config of the target
    assistant: Dict[str, Any] = None  # the published assistant config: its text config and head

    @property
    def config(self) -> Dict[str, Any]:
        """What the memory check reads before anything is downloaded: the published text config."""
        return self.text


_COMMON = dict(vocab_size=262144, head_dim=256, global_head_dim=512, final_logit_softcapping=30.0,
               max_position_embeddings=131072)

SIZES: Dict[str, Size] = {
    size.name: size
    for size in [
        Size(
            "e2b", "mlx-community/gemma-4-e2b-it-4bit", "mlx-community/gemma-4-E2B-it-assistant-bf16",
            dict(_COMMON, hidden_size=1536, num_hidden_layers=35, layer_types=_layers(5, 35),
                 intermediate_size=6144, num_attention_heads=8, num_key_value_heads=1, num_kv_shared_layers=20,
                 hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, sliding_window=512,
                 use_double_wide_mlp=True, attention_k_eq_v=False, enable_moe_block=False),
            dict(backbone_hidden_size=1536, use_ordered_embeddings=True, hidden_size=256, intermediate_size=2048,
                 num_attention_heads=4, num_key_value_heads=1, sliding_window=512),
        ),
        Size(
            "e4b", "mlx-community/gemma-4-e4b-it-4bit", "mlx-community/gemma-4-E4B-it-assistant-bf16",
            dict(_COMMON, hidden_size=2560, num_hidden_layers=42, layer_types=_layers(6, 42),
                 intermediate_size=10240, num_attention_heads=8, num_key_value_heads=2, num_kv_shared_layers=18,
                 hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, sliding_window=512,
                 use_double_wide_mlp=False, attention_k_eq_v=False, enable_moe_block=False),
            dict(backbone_hidden_size=2560, use_ordered_embeddings=True, hidden_size=256, intermediate_size=2048,
                 num_attention_heads=4, num_key_value_heads=2, sliding_window=512),
        ),
        Size(
            "26b-a4b", "mlx-community/gemma-4-26b-a4b-it-4bit", "mlx-community/gemma-4-26B-A4B-it-assistant-bf16",
            dict(_COMMON, hidden_size=2816, num_hidden_layers=30, layer_types=_layers(6, 30),
                 intermediate_size=2112, num_attention_heads=16, num_key_value_heads=8,
                 num_global_key_value_heads=2, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
                 vocab_size_per_layer_input=262144, sliding_window=1024, use_double_wide_mlp=False,
                 attention_k_eq_v=True, enable_moe_block=True, num_experts=128, top_k_experts=8,
                 moe_intermediate_size=704),
            dict(backbone_hidden_size=2816, use_ordered_embeddings=False, hidden_size=1024, intermediate_size=8192,
                 num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=2,
                 attention_k_eq_v=True, sliding_window=1024),
        ),
        Size(
            "31b", "mlx-community/gemma-4-31b-it-4bit", "mlx-community/gemma-4-31B-it-assistant-bf16",
            dict(_COMMON, hidden_size=5376, num_hidden_layers=60, layer_types=_layers(6, 60),
                 intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
                 num_global_key_value_heads=4, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
                 vocab_size_per_layer_input=262144, sliding_window=1024, use_double_wide_mlp=False,
                 attention_k_eq_v=True, enable_moe_block=False),
            dict(backbone_hidden_size=5376, use_ordered_embeddings=False, hidden_size=1024, intermediate_size=8192,
                 num_attention_heads=32, num_key_value_heads=16, num_global_key_value_heads=4,
                 attention_k_eq_v=True, sliding_window=1024),
        ),
        # The 12B (model type gemma4_unified): the same text network without per-layer embeddings,
        # its media entering through encoder-free embedders (no towers).
        Size(
            "12b", "mlx-community/gemma-4-12B-it-4bit", "mlx-community/gemma-4-12B-it-assistant-bf16",
            dict(_COMMON, hidden_size=3840, num_hidden_layers=48, layer_types=_layers(6, 48),
                 intermediate_size=15360, num_attention_heads=16, num_key_value_heads=8,
                 num_global_key_value_heads=1, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
                 sliding_window=1024, use_double_wide_mlp=False, attention_k_eq_v=True, enable_moe_block=False,
                 max_position_embeddings=262144),
            dict(backbone_hidden_size=3840, use_ordered_embeddings=False, hidden_size=1024, intermediate_size=8192,
                 num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=1,
                 attention_k_eq_v=True, sliding_window=1024),
        ),
    ]
}



def size_of(text: Mapping[str, Any]) -> Optional[str]:
    """The name of the size whose published text config has this one's structure: width, depth,
    layer pattern and K/V sharing (any quantization or fine-tune of it), else None."""
    keys = ("hidden_size", "num_hidden_layers", "num_kv_shared_layers", "layer_types")
    for size in SIZES.values():
        if all(text.get(k) == size.text[k] for k in keys):
            return size.name
    return None
