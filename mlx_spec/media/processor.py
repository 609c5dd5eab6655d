"""A checkpoint's processor settings: how its images and audio become the model's inputs.

transformers (5.24) saves a processor as one `processor_config.json`: the processor's own
arguments at the top (`image_seq_length`, `audio_seq_length`), its image processor's settings
under `image_processor` and its audio feature extractor's under `feature_extractor`. Older saves
put a sub-processor's settings, flat, in `preprocessor_config.json`. transformers reads the
nested dict where there is one and that file where there is not, and so does this module. What
neither file says keeps transformers' class defaults, which are what mlx-spec used before it read
the files.

Only the settings Gemma 4's processors read are looked at (mlx-vlm's conversions, for one, add
an image `size` that Gemma 4's processors do not use). Among those, what mlx-spec does not
implement (normalised pixels, another resampling filter, dither, pre-emphasis, ...) is refused
by name: ignoring it would make inputs other than the ones transformers makes from the same file.
A malformed file or value is refused by name too. Both are `MediaError`s, raised when the media
encoder is made: at the first image or clip, or at start with `load(..., media=True)`.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from ..errors import MediaError
from .audio import MelSettings
from .images import RESCALE, SOFT_TOKEN_BUDGETS

PROCESSOR, PREPROCESSOR = "processor_config.json", "preprocessor_config.json"
IMAGE, AUDIO = "image_processor", "feature_extractor"
TOWER_IMAGE_TYPES = ("Gemma4ImageProcessor", "Gemma4ImageProcessorPil")
UNIFIED_IMAGE_TYPES = ("Gemma4UnifiedImageProcessor",)
# Image settings mlx-spec implements only at the value Gemma 4's processors ship with (3: bicubic).
# image_mean and image_std are read by transformers only when do_normalize is true.
IMAGE_AS_SHIPPED = {"do_resize": True, "do_rescale": True, "do_normalize": False, "do_convert_rgb": True,
                    "resample": 3}
MEL_AS_SHIPPED = {"dither": 0.0, "preemphasis": 0.0, "input_scale_factor": 1.0, "per_bin_mean": None,
                  "per_bin_stddev": None, "padding_value": 0.0, "padding_side": "right"}


@dataclass(frozen=True)
class ImageSettings:
    max_soft_tokens: int = 280  # the budget when a request names none
    patch_size: int = 16
    pooling_kernel_size: int = 3
    rescale_factor: float = RESCALE


@dataclass(frozen=True)
class WaveSettings:
    """The 12B's extractor (`Gemma4UnifiedAudioFeatureExtractor`): raw frames, one token each."""

    sampling_rate: int = 16_000
    samples_per_token: int = 640


@dataclass(frozen=True)
class ProcessorFiles:
    """The parts of a checkpoint's processor files, as dicts ({} where there is none), and the
    file each came from (for messages)."""

    image: Mapping[str, Any]
    audio: Mapping[str, Any]
    processor: Mapping[str, Any]
    where: Mapping[str, str]


def read_processor(path: Path) -> ProcessorFiles:
    """The processor files of the checkpoint folder at `path` (see the module's docstring)."""
    nested, flat = _read_json(Path(path) / PROCESSOR), _read_json(Path(path) / PREPROCESSOR)
    parts: Dict[str, Mapping[str, Any]] = {}
    where = {}
    for part, keys in ((IMAGE, (IMAGE,)), (AUDIO, (AUDIO, "audio_processor"))):  # as transformers looks
        key = next((k for k in keys if k in (nested or {})), None)
        if key is not None:
            parts[part], where[part] = nested[key], f"{Path(path) / PROCESSOR} ({key})"
        else:
            parts[part], where[part] = flat or {}, str(Path(path) / PREPROCESSOR)
        if not isinstance(parts[part], dict):
            raise MediaError(f"{where[part]}: must be a JSON object, got {type(parts[part]).__name__}")
    where["processor"] = str(Path(path) / PROCESSOR)
    return ProcessorFiles(parts[IMAGE], parts[AUDIO], nested or {}, where)


def _read_json(file: Path) -> Optional[dict]:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MediaError(f"{file}: not a readable JSON file ({e}); fix or remove it") from None
    if not isinstance(data, dict):
        raise MediaError(f"{file}: must be a JSON object, got {type(data).__name__}")
    return data


def image_settings(files: ProcessorFiles, patch_size: int, pooling_kernel_size: int,
                   types: Sequence[str]) -> ImageSettings:
    """The image processor's settings. `patch_size` and `pooling_kernel_size`: the vision
    encoder's (config.json), which a processor file may restate but not contradict: the encoder
    cannot take other patches, nor pool them into another count of soft tokens."""
    part, where = files.image, files.where[IMAGE]
    _check_type(part, "image_processor_type", types, where)
    _check_as_shipped(part, IMAGE_AS_SHIPPED, where)
    budget = _value(part, "max_soft_tokens", 280, where, _is_int, f"one of {', '.join(map(str, SOFT_TOKEN_BUDGETS))}",
                    lambda v: v in SOFT_TOKEN_BUDGETS)
    # transformers expands each image to the image processor's count: image_seq_length, which
    # google's files write beside it, is never read for it. One that disagrees would be followed
    # silently by nobody, so it is refused.
    for scope, at in ((files.processor, files.where["processor"]), (part, where)):
        stated = scope.get("image_seq_length")
        if stated is not None and stated != budget:
            raise MediaError(f"{at}: image_seq_length {stated!r} disagrees with the image processor's max_soft_tokens "
                             f"{budget} (what transformers' processor uses); make them agree")
    return ImageSettings(
        budget, _matching(part, "patch_size", patch_size, where, "the vision encoder's (vision_config.patch_size)"),
        _matching(part, "pooling_kernel_size", pooling_kernel_size, where,
                  "the vision encoder's (vision_config.pooling_kernel_size)"),
        _value(part, "rescale_factor", RESCALE, where, _is_number, "a positive number", lambda v: v > 0))


def mel_settings(files: ProcessorFiles, mel_bands: int = 128) -> MelSettings:
    """The towers' extractor (`Gemma4AudioFeatureExtractor`). `mel_bands`: what the audio tower
    takes, which the extractor's feature_size may restate but not contradict. Frame and hop come
    from their lengths in ms, and the FFT's size from the frame, as transformers computes them on
    loading; the sample counts it also saves must agree (it does not read them back)."""
    part, where = files.audio, files.where[AUDIO]
    _check_type(part, "feature_extractor_type", ("Gemma4AudioFeatureExtractor",), where)
    _check_as_shipped(part, MEL_AS_SHIPPED, where)
    rate = _value(part, "sampling_rate", 16_000, where, _is_int, "a positive integer", lambda v: v > 0)
    frame = int(round(rate * _value(part, "frame_length_ms", 20.0, where, _is_number, "positive", lambda v: v > 0)
                      / 1000.0))
    hop = int(round(rate * _value(part, "hop_length_ms", 10.0, where, _is_number, "positive", lambda v: v > 0)
                    / 1000.0))
    if frame < 2 or hop < 1:
        raise MediaError(f"{where}: frames of {frame} samples every {hop} are too short to analyse")
    overdrive = _value(part, "fft_overdrive", False, where, _is_bool, "true or false")
    low = _value(part, "min_frequency", 0.0, where, _is_number, "a number >= 0", lambda v: v >= 0)
    high = _value(part, "max_frequency", 8000.0, where, _is_number, f"a number above min_frequency {low}",
                  lambda v: v > low)
    settings = MelSettings(
        rate, _matching(part, "feature_size", mel_bands, where, "the audio tower's mel bands"), frame, hop,
        2 ** math.ceil(math.log2(frame)) * (2 if overdrive else 1), low, high,
        _value(part, "mel_floor", 1e-3, where, _is_number, "a positive number", lambda v: v > 0),
        _value(files.processor, "audio_seq_length", 750, files.where["processor"], _is_int, "a positive integer",
               lambda v: v > 0))
    for key in ("frame_length", "hop_length", "fft_length"):
        saved = part.get(key)
        if saved is not None and saved != getattr(settings, key):
            # transformers saves a frame of 25 ms as "frame_length": 400 but reads it back as 320.
            raise MediaError(f"{where}: {key} {saved!r} is not the {getattr(settings, key)} samples that its "
                             f"frame_length_ms, hop_length_ms and fft_overdrive make, which transformers uses on "
                             f"loading; make them agree")
    return settings


def wave_settings(files: ProcessorFiles, samples_per_token: int) -> WaveSettings:
    """The 12B's extractor. `samples_per_token`: the audio embedder's input width
    (`audio_embed_dim`), which audio_samples_per_token may restate but not contradict."""
    part, where = files.audio, files.where[AUDIO]
    _check_type(part, "feature_extractor_type", ("Gemma4UnifiedAudioFeatureExtractor",), where)
    rate = _value(part, "sampling_rate", 16_000, where, _is_int, "a positive integer", lambda v: v > 0)
    return WaveSettings(rate, _matching(part, "audio_samples_per_token", samples_per_token, where,
                                        "the audio embedder's input (audio_config.audio_embed_dim)"))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_bool(v) -> bool:
    return isinstance(v, bool)


def _value(part: Mapping[str, Any], key: str, default, where: str, kind, rule: str, check=None):
    """part[key], or `default` where it is absent or null (as transformers takes it)."""
    value = part.get(key)
    if value is None:
        return default
    if not kind(value) or (check is not None and not check(value)):
        raise MediaError(f"{where}: {key} must be {rule}, got {value!r}")
    return value


def _matching(part: Mapping[str, Any], key: str, model: int, where: str, what: str) -> int:
    """part[key], which must be the model's own value (`what` names it), its default."""
    value = _value(part, key, model, where, _is_int, "a positive integer", lambda v: v > 0)
    if value != model:
        raise MediaError(f"{where}: {key} {value} is not {what} {model}: the model cannot take these inputs")
    return value


def _check_type(part: Mapping[str, Any], key: str, types: Sequence[str], where: str) -> None:
    name = part.get(key)
    if name is not None and name not in types:
        raise MediaError(f"{where}: {key} {name!r} is not Gemma 4's ({' or '.join(types)}) for this checkpoint")


def _check_as_shipped(part: Mapping[str, Any], shipped: Mapping[str, Any], where: str) -> None:
    for key, value in shipped.items():
        got = part.get(key)
        if got is None or _same(got, value):
            continue
        raise MediaError(f"{where}: {key} {json.dumps(got)} is not implemented; mlx-spec makes Gemma 4's inputs as its "
                         f"processors ship ({key} {json.dumps(value)})")


def _same(got, value) -> bool:
    """Equal and of the same kind: JSON's 1 is not true, but 0 and 0.0 are the same number."""
    if _is_number(got) and _is_number(value):
        return got == value
    return type(got) is type(value) and got == value
