"""The media encoder of Gemma 4 E2B, E4B, 26B-A4B and 31B (`model_type` gemma4): a vision tower
(`vision_tower.*`, `embed_vision.*`) and, on E2B and E4B, an audio tower (`audio_tower.*`,
`embed_audio.*`). Items are made from the config and the processor files alone (processor.py);
the towers' weights are read the first time an item is embedded (on the thread that runs the
model), or by `load()`."""

from dataclasses import replace
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..errors import MediaError
from .audio import MAX_SAMPLES, MEL, audio_features, audio_tokens, read_audio
from .audio_tower import (
    CLIP_BOUNDS,
    AudioConfig,
    Conformer,
    soft_tokens,
    to_module_layout,
)
from .images import image_patches
from .items import AUDIO, IMAGE, MediaItem
from .layers import MultimodalEmbedder
from .processor import TOWER_IMAGE_TYPES, image_settings, mel_settings, read_processor
from .prompt import MediaTokens
from .vision_tower import VisionTower, vision_config
from .weights import load_media_module, read_media_weights


class Towers(nn.Module):
    """The towers and their embedders into the text model's width, named as the checkpoint."""

    def __init__(self, config: dict):
        super().__init__()
        text_width = config["text_config"]["hidden_size"]
        if config.get("vision_config") is not None:
            vision = vision_config(config["vision_config"])
            self.vision_tower = VisionTower(vision)
            self.embed_vision = MultimodalEmbedder(vision["hidden_size"], text_width, vision["rms_norm_eps"])
        if config.get("audio_config") is not None:
            audio = AudioConfig.from_dict(config["audio_config"])
            self.audio_tower = Conformer(audio)
            self.embed_audio = MultimodalEmbedder(audio.output_proj_dims, text_width, audio.rms_norm_eps)


class TowerMedia:
    """Images as the image processor cuts them (the checkpoint processor's budget of soft tokens
    at most, or a request's, one per k x k patches), embedded by the vision tower; audio as
    log-mel frames as the processor's extractor makes them, embedded by the audio tower (one soft
    token per 40 ms with its default frames, at most 30 s)."""

    def __init__(self, path: Path, config: dict):
        self.path, self.config = path, config
        self.tokens = MediaTokens.from_config(config)
        vision = config.get("vision_config")
        self.vision = vision_config(vision) if vision is not None else None
        audio = config.get("audio_config")
        self.audio_config = AudioConfig.from_dict(audio) if audio is not None else None
        files = read_processor(path)
        self.images = (image_settings(files, self.vision["patch_size"], self.vision["pooling_kernel_size"],
                                      TOWER_IMAGE_TYPES) if vision is not None else None)
        # The tower's projection is sized for its first convolution's channels / 4 mel columns
        # after the two stride-2 convolutions: 128 bands for the released 128 channels.
        self.mel = (mel_settings(files, self.audio_config.subsampling_conv_channels[0])
                    if audio is not None else MEL)
        self.can = {IMAGE: vision is not None, AUDIO: audio is not None}
        self._towers: Optional[Towers] = None

    @property
    def towers(self) -> Towers:
        self.load()
        return self._towers

    def load(self) -> None:
        """Read the towers' weights now, if they are not yet."""
        if self._towers is None:
            towers = Towers(self.config)
            prefixes = [p for p, part in (("vision_tower.", IMAGE), ("embed_vision.", IMAGE), ("audio_tower.", AUDIO),
                                          ("embed_audio.", AUDIO)) if self.can[part]]
            weights = to_module_layout(read_media_weights(self.path, prefixes), dict(tree_flatten(towers.parameters())))
            self._towers = load_media_module(towers, weights, self.config, self.path, self._used)

    def _used(self, key: str) -> bool:
        """Clip bounds are written by some converters even where the config turns clipping off."""
        if not key.endswith(CLIP_BOUNDS):
            return True
        if key.startswith("audio_tower."):
            return self.audio_config.use_clipped_linears
        return self.vision["use_clipped_linears"]

    def image(self, source, image_tokens: Optional[int] = None) -> MediaItem:
        """`image_tokens`: a request's budget, which wins over the processor's."""
        s = self.images
        patches = image_patches(source, image_tokens or s.max_soft_tokens, s.patch_size, s.pooling_kernel_size,
                                s.rescale_factor)
        if patches.positions.max() >= self.vision["position_embedding_size"]:
            raise MediaError(f"the image is {patches.positions.max() + 1} patches long on one side; the vision tower "
                             f"has positions for {self.vision['position_embedding_size']}")
        return MediaItem.of(IMAGE, patches.soft_tokens, patches.pixels, patches.positions.astype(np.int32))

    def audio(self, source) -> MediaItem:
        samples = read_audio(source, self.mel.sampling_rate)[:MAX_SAMPLES]
        features = audio_features(samples, self.mel)
        # Every soft token the tower makes, as transformers' processor writes them: its
        # audio_seq_length caps only the count it gives vLLM, so a clip past it is refused here
        # rather than cut short in the prompt and not in the tower (by default 30 s, the longest
        # clip, makes 750, the cap).
        tokens = audio_tokens(samples.size, replace(self.mel, max_tokens=MAX_SAMPLES))
        if tokens == 0:
            raise MediaError(f"the audio is too short for one soft token: {samples.size} samples")
        if tokens > self.mel.max_tokens:
            raise MediaError(f"the audio makes {tokens} soft tokens, more than the processor's audio_seq_length "
                             f"{self.mel.max_tokens}; cut it shorter")
        return MediaItem.of(AUDIO, tokens, features.features, features.mask)

    def embed(self, item: MediaItem) -> mx.array:
        """[tokens, hidden]: the item's inputs to the text model (before its embedding scale)."""
        if item.kind == AUDIO:
            towers = self.towers
            return soft_tokens(towers.audio_tower, towers.embed_audio, *item.arrays)
        pixels, positions = item.arrays
        grid = (int(positions[:, 1].max()) + 1, int(positions[:, 0].max()) + 1)
        towers = self.towers
        return towers.embed_vision(towers.vision_tower(mx.array(pixels), mx.array(positions), grid))
