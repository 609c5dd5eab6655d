"""Images and audio for Gemma 4's prompts: reading them and turning them into the arrays its
media towers take, as transformers' processors do (`images.py`, `audio.py`).

This is the first part of media support: the preprocessing, held equal to transformers' own
processors by the tests. The towers and the prompt path that use these arrays come next.
"""

from ..errors import MediaError
from .audio import AudioFeatures, audio_features, audio_tokens, read_wav
from .images import ImagePatches, image_patches, read_image

__all__ = ["AudioFeatures", "ImagePatches", "MediaError", "audio_features", "audio_tokens", "image_patches",
           "read_image", "read_wav"]
