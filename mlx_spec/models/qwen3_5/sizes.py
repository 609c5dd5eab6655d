"""Qwen3.5 and Qwen3.6 by name: the 4-bit MLX conversion of the instruction-tuned target, and
its MTP layer split into a drafter folder of its own (mlx-community's `*-MTP-bf16`, model_type
qwen3_5_mtp: the conversions themselves drop the layer). Everything the code does with a model
still comes from its config. docs/models.md says where each id was found."""

from typing import Any, Dict, Optional

from ..registry import Size, sizes_by_name

SIZES: Dict[str, Size] = sizes_by_name([
    Size("qwen3.5-4b", "mlx-community/Qwen3.5-4B-4bit", "mlx-community/Qwen3.5-4B-MTP-bf16"),
    Size("qwen3.5-9b", "mlx-community/Qwen3.5-9B-4bit", "mlx-community/Qwen3.5-9B-MTP-bf16"),
    Size("qwen3.6-27b", "mlx-community/Qwen3.6-27B-4bit", "mlx-community/Qwen3.6-27B-MTP-bf16"),
    Size("qwen3.6-35b-a3b", "mlx-community/Qwen3.6-35B-A3B-4bit", "mlx-community/Qwen3.6-35B-A3B-MTP-bf16"),
])


def size_of(target: Any) -> Optional[str]:
    """No size is told by its structure alone yet (3.5 and 3.6 share their shapes)."""
    return None
