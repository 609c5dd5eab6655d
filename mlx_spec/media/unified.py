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

from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import MediaError
from .audio import read_audio
from .images import patchify, resized_pixels
from .items import AUDIO, IMAGE, MediaItem
from .layers import MultimodalEmbedder
from .processor import UNIFIED_IMAGE_TYPES, image_settings, read_processor, wave_settings
from .prompt import MediaTokens
from .weights import load_media_module, read_media_weights


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
    """The embedders of a gemma4_unified checkpoint, in either layout, quantized where the
    conversion quantized them."""
    return load_media_module(UnifiedEmbedders(config), read_media_weights(path, PREFIXES), config, path)


class UnifiedMedia:
    """The 12B's media encoder: items from images and audio (from the config and the processor
    files alone: processor.py), their embeddings at prefill (the weights are read then).

    An image is resized to the patch budget (the processor's, or a request's) as Gemma 4's
    processor does, then cut into patches of `pooling_kernel_size` · `patch_size` pixels:
    transformers' unified processor cuts 16-pixel patches and merges each k x k block of them
    into one, pixel rows in order, which is the same array. Each merged patch is one soft token.
    Audio is cut into frames of `audio_embed_dim` samples (the extractor's
    audio_samples_per_token; the last one padded with zeros), one soft token each."""

    def __init__(self, path: Path, config: dict):
        self.path, self.config = path, config
        self.tokens = MediaTokens.from_config(config)
        vision, audio = config.get("vision_config") or {}, config.get("audio_config") or {}
        files = read_processor(path)
        self.images = image_settings(files, vision.get("patch_size", 16), vision.get("pooling_kernel_size", 3),
                                     UNIFIED_IMAGE_TYPES) if vision else None
        self.wave = wave_settings(files, audio.get("audio_embed_dim", 640)) if audio else None
        self.can = {IMAGE: bool(vision), AUDIO: bool(audio)}
        self._embedders: Optional[UnifiedEmbedders] = None

    @property
    def embedders(self) -> UnifiedEmbedders:
        """The weights, read the first time an item is embedded (on the thread that runs the
        model: prefill calls `embed`)."""
        self.load()
        return self._embedders

    def load(self) -> None:
        """Read the weights now, if they are not yet."""
        if self._embedders is None:
            self._embedders = load_unified_embedders(self.path, self.config)

    def image(self, source, image_tokens: Optional[int] = None) -> MediaItem:
        """`image_tokens`: a request's budget, which wins over the processor's."""
        s = self.images
        pixels = resized_pixels(source, image_tokens or s.max_soft_tokens, s.patch_size, s.pooling_kernel_size,
                                backend="torchvision", rescale_factor=s.rescale_factor)
        patches, positions = patchify(pixels, s.patch_size * s.pooling_kernel_size)
        return MediaItem.of(IMAGE, len(patches), patches, positions.astype(np.int32))

    def audio(self, source) -> MediaItem:
        samples = read_audio(source, self.wave.sampling_rate)
        if samples.size == 0:
            raise MediaError("the audio is empty")
        if not np.isfinite(samples).all():
            raise MediaError("the audio has samples that are not finite numbers")
        frame = self.wave.samples_per_token
        frames = np.zeros(-(-samples.size // frame) * frame, np.float32)
        frames[: samples.size] = samples
        frames = frames.reshape(-1, frame)
        return MediaItem.of(AUDIO, len(frames), frames)

    def embed(self, item: MediaItem) -> mx.array:
        """[tokens, hidden]: the item's inputs to the text model (before its embedding scale)."""
        if item.kind == IMAGE:
            patches, positions = item.arrays
            return self.embedders.image(mx.array(patches), mx.array(positions))
        return self.embedders.audio(mx.array(item.arrays[0]))
