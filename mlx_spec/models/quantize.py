"""Quantizing a full-precision model after loading (the drafter's --drafter-bits and
--drafter-mode), in any mode MLX quantizes in. Checkpoints saved quantized need none of this:
mlx-lm's loader reads their mode, bits and group size from their config."""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..errors import LoadError

# Each mode MLX quantizes in, with the bits and group size it allows (affine: 4 or 8 bits here).
QUANT_MODES = {"affine": (None, 64), "mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}


def check_quantization(bits: Optional[int], mode: str) -> int:
    """The bits `mode` quantizes to with `bits` asked for; a LoadError for what it cannot do."""
    if mode not in QUANT_MODES:
        raise LoadError(f"drafter quantization mode must be one of {', '.join(QUANT_MODES)}, got {mode!r}")
    mode_bits, _ = QUANT_MODES[mode]
    if mode == "affine" and bits not in (4, 8):
        asked = "none (give --drafter-bits, or drafter_bits)" if bits is None else bits
        raise LoadError(f"affine drafter quantization must be 4 or 8 bits, got {asked}")
    if mode_bits and bits not in (None, mode_bits):
        raise LoadError(f"drafter quantization mode {mode} is {mode_bits}-bit, got {bits} bits")
    return bits or mode_bits


def quantize_drafter(model: nn.Module, bits: Optional[int], mode: str = "affine") -> None:
    """Quantize every layer whose input width the mode's group size divides (the rest stay as
    they are: MLX cannot quantize them)."""
    bits = check_quantization(bits, mode)
    group_size = QUANT_MODES[mode][1]

    def fits(path: str, module: nn.Module) -> bool:
        if not hasattr(module, "to_quantized"):
            return False
        return module.weight.shape[-1] % group_size == 0

    nn.quantize(model, group_size=group_size, bits=bits, mode=mode, class_predicate=fits)
    mx.eval(model.parameters())
