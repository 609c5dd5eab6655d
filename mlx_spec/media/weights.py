"""Reading a media encoder's weights from a checkpoint, in google's layout (`model.<part>.*`) or
mlx-vlm's conversions (`<part>.*`, some layers quantized), into an MLX module whose parameter
names are those keys without `model.`."""

import glob
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..errors import MediaError


def read_media_weights(path: Path, prefixes: Sequence[str]) -> Dict[str, mx.array]:
    """The checkpoint's tensors whose names (without `model.`) start with one of `prefixes`."""
    weights: Dict[str, mx.array] = {}
    for file in sorted(glob.glob(str(Path(path) / "model*.safetensors"))):
        for key, value in mx.load(file).items():
            key = key.removeprefix("model.")
            if key.startswith(tuple(prefixes)):
                weights[key] = value
    if not weights:
        raise MediaError(f"{path}: no media encoder weights (a text-only checkpoint)")
    return weights


def load_media_module(module: nn.Module, weights: Dict[str, mx.array], config: dict, path: Path,
                      keep: Optional[Callable[[str], bool]] = None) -> nn.Module:
    """`module` with `weights` loaded, strictly: layers the conversion quantized (those with
    `.scales`) are quantized first, with the checkpoint's bits, group size and mode. `keep`
    drops tensors the module does not use (mlx-vlm's converter writes some anyway)."""
    if keep is not None:
        weights = {k: v for k, v in weights.items() if keep(k)}
    quantization: Optional[dict] = config.get("quantization")
    if any(k.endswith(".scales") for k in weights):
        quantization = quantization or {}

        def quantized(name: str, layer: nn.Module):
            if f"{name}.scales" not in weights:
                return False
            own = quantization.get(name)
            return own if isinstance(own, dict) else True

        nn.quantize(module, group_size=quantization.get("group_size", 64), bits=quantization.get("bits", 4),
                    mode=quantization.get("mode", "affine"), class_predicate=quantized)
    try:
        module.load_weights(list(weights.items()))
    except ValueError as e:
        raise MediaError(f"{path}: the media encoder weights do not fit the config: {' '.join(str(e).split())}") from None
    mx.eval(module.parameters())
    return module
