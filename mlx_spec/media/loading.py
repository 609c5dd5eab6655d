"""The media encoder of a target checkpoint, loaded when the first image or audio clip arrives.

A text prompt never pays for it: the encoder is made from the config when a prompt first has
media, and its weights are read when the first item goes through the model (on the model's
thread); `load(..., media=True)` reads them up front (to fail at start rather than at the first
request).
"""

from pathlib import Path

from ..errors import MediaError
from .items import AUDIO, IMAGE

UNIFIED, TOWERS = "gemma4_unified", "gemma4"


def load_media(path: Path, config: dict):
    """The encoder for the checkpoint at `path` (its config.json as `config`)."""
    model_type = config.get("model_type")
    if model_type == UNIFIED:
        from .unified import UnifiedMedia

        return UnifiedMedia(path, config)
    if model_type == TOWERS:
        from .towers import TowerMedia

        return TowerMedia(path, config)
    raise MediaError(f"{path}: a text-only checkpoint (model_type {model_type}): it has no image or audio input; "
                     "load the full checkpoint (model_type gemma4 or gemma4_unified) for media")


def check_kind(encoder, kind: str, path: Path) -> None:
    """A clear error for media the checkpoint has no encoder for."""
    if not encoder.can.get(kind):
        lacks = {IMAGE: "vision encoder (no vision_config)", AUDIO: "audio encoder (no audio_config)"}[kind]
        raise MediaError(f"{path} has no {lacks}: it cannot take {kind} input")
