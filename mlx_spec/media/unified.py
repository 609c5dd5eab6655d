"""The 12B's media embedders in MLX (`gemma4_unified`): no vision or audio tower. An image's
merged pixel patches go through LayerNorm, a dense layer and LayerNorm, gain a factorised 2-D
position embedding (one table row per axis, added), a LayerNorm, then the multimodal embedder
(an RMS norm without scale and a projection to the text model's width). Audio is raw waveform
frames through the multimodal embedder alone. As transformers' `Gemma4UnifiedVisionEmbedder` and
`Gemma4UnifiedMultimodalEmbedder`.

Weights load from google's layout (`model.vision_embedder.*`, `model.embed_vision.*`,
`model.embed_audio.*`) and from mlx-vlm's conversions (the same names without `model.`,
quantized or not).
"""

import glob
from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn

from .audio import MediaError


class MultimodalEmbedder(nn.Module):
    """RMS norm without a scale, then a projection to the text model's width."""

    def __init__(self, width: int, text_width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.embedding_projection = nn.Linear(width, text_width, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(mx.fast.rms_norm(x, None, self.eps))


class VisionEmbedder(nn.Module):
    """Merged pixel patches [N, (k·p)²·3] with (x, y) positions [N, 2] (-1 for padding) to
    their pre-projection embeddings [N, mm_embed_dim]."""

    def __init__(self, patch_dim: int, width: int, posemb_size: int):
        super().__init__()
        # torch.nn.LayerNorm's default epsilon, as transformers builds these three.
        self.patch_ln1 = nn.LayerNorm(patch_dim, eps=1e-5)
        self.patch_dense = nn.Linear(patch_dim, width)
        self.patch_ln2 = nn.LayerNorm(width, eps=1e-5)
        self.pos_embedding = mx.zeros((posemb_size, 2, width))
        self.pos_norm = nn.LayerNorm(width, eps=1e-5)

    def __call__(self, pixels: mx.array, positions: mx.array) -> mx.array:
        x = self.patch_ln2(self.patch_dense(self.patch_ln1(pixels)))
        valid = mx.all(positions != -1, axis=-1, keepdims=True).astype(x.dtype)
        clamped = mx.maximum(positions, 0)
        position = self.pos_embedding[clamped[..., 0], 0] + self.pos_embedding[clamped[..., 1], 1]
        return self.pos_norm(x + position * valid)


class UnifiedEmbedders(nn.Module):
    """The 12B's image and audio embedders, as loaded from a checkpoint's config."""

    def __init__(self, config: dict):
        super().__init__()
        text_width = config["text_config"]["hidden_size"]
        vision, audio = config.get("vision_config"), config.get("audio_config")
        if vision is not None:
            patch = vision.get("patch_size", 16) * vision.get("pooling_kernel_size", 3)
            width = vision.get("mm_embed_dim", 3840)
            self.vision_embedder = VisionEmbedder(patch * patch * 3, width, vision.get("mm_posemb_size", 1120))
            self.embed_vision = MultimodalEmbedder(vision.get("output_proj_dims", width), text_width,
                                                   vision.get("rms_norm_eps", 1e-6))
        if audio is not None:
            self.embed_audio = MultimodalEmbedder(audio.get("audio_embed_dim", 640), text_width,
                                                  audio.get("rms_norm_eps", 1e-6))

    def image(self, pixels: mx.array, positions: mx.array) -> mx.array:
        """Text-width embeddings [N, hidden] of one image's merged patches."""
        if "vision_embedder" not in self:
            raise MediaError("this checkpoint has no vision embedder: it cannot read images")
        return self.embed_vision(self.vision_embedder(pixels, positions))

    def audio(self, frames: mx.array) -> mx.array:
        """Text-width embeddings [N, hidden] of raw waveform frames [N, audio_embed_dim]."""
        if "embed_audio" not in self:
            raise MediaError("this checkpoint has no audio embedder: it cannot hear audio")
        return self.embed_audio(frames)


PREFIXES = ("vision_embedder.", "embed_vision.", "embed_audio.")


def load_unified_embedders(path: Path, config: dict) -> UnifiedEmbedders:
    """The embedders of a gemma4_unified checkpoint, in either layout; quantized projections
    (mlx-vlm's conversions) come back quantized with the checkpoint's bits and group size."""
    weights: Dict[str, mx.array] = {}
    for file in sorted(glob.glob(str(Path(path) / "model*.safetensors"))):
        for key, value in mx.load(file).items():
            key = key.removeprefix("model.")
            if key.startswith(PREFIXES):
                weights[key] = value
    if not weights:
        raise MediaError(f"{path}: no media embedder weights (a text-only checkpoint)")
    embedders = UnifiedEmbedders(config)
    quantization: Optional[dict] = config.get("quantization")
    if any(k.endswith(".scales") for k in weights):
        quantization = quantization or {}

        def quantized(name: str, module: nn.Module):
            if f"{name}.scales" not in weights:
                return False
            own = quantization.get(name)
            return own if isinstance(own, dict) else True

        nn.quantize(embedders, group_size=quantization.get("group_size", 64), bits=quantization.get("bits", 4),
                    mode=quantization.get("mode", "affine"), class_predicate=quantized)
    try:
        embedders.load_weights(list(weights.items()))
    except ValueError as e:
        raise MediaError(f"{path}: the media embedder weights do not fit the config: {' '.join(str(e).split())}") from None
    mx.eval(embedders.parameters())
    return embedders

