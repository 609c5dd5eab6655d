"""Audio as Gemma 4's audio tower takes it, as transformers' `Gemma4AudioFeatureExtractor` makes
it: mono samples in [-1, 1] at the extractor's rate (16 kHz), padded to a multiple of 128 samples
(at most 30 s: longer audio is cut, as there), framed semi-causally (20 ms frames every 10 ms,
half a frame of silence before the first), a periodic Hann window, the magnitude of an FFT
(512 points: the frame's length rounded up to a power of two), 128 HTK mel bands from 0 to 8 kHz,
and the log of (mel + 0.001). Frames that reach into the padding are masked and zeroed. Those
numbers are the extractor's defaults, which google's checkpoints keep; a checkpoint's processor
config may say others (`MelSettings`, read by processor.py). WAV files are read with the
standard library; other formats (FLAC, OGG, MP3) with soundfile where it is installed (an
optional extra: `pip install "mlx-spec[audio]"`).
"""

import io
import re
import wave
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Union

import numpy as np

from ..errors import MediaError

SAMPLE_RATE = 16_000
# 30 s at 16 kHz: the max_length transformers' extractor truncates to. It is an argument of its
# call, not a setting it saves or reads, so a processor config does not change it.
MAX_SAMPLES = 480_000
PAD_TO = 128  # likewise its call's pad_to_multiple_of
# The audio tower's two stride-2 convolutions (kernel 3, padding 1) over the mel frames.
SUBSAMPLING = 2


@dataclass(frozen=True)
class MelSettings:
    """What the extractor computes with (its defaults here), and the processor's cap on a clip's
    soft tokens (`audio_seq_length`)."""

    sampling_rate: int = SAMPLE_RATE
    mel_bands: int = 128  # the extractor's feature_size
    frame_length: int = 320  # samples: 20 ms
    hop_length: int = 160  # 10 ms
    fft_length: int = 512
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    mel_floor: float = 1e-3
    max_tokens: int = 750


MEL = MelSettings()


@dataclass
class AudioFeatures:
    features: np.ndarray  # [frames, mel_bands] float32 log-mel, zero where masked
    mask: np.ndarray  # [frames] bool: frames wholly inside the audio


def read_wav(source: Union[str, Path, bytes], rate: int = SAMPLE_RATE) -> np.ndarray:
    """An audio file (path or bytes) as mono float32 samples in [-1, 1] at `rate` (the
    extractor's sampling_rate): PCM WAV (8, 16, 24 or 32 bits, any channel count) by the standard
    library, another format through soundfile where it is installed. Other rates are refused
    with the rate named: resampling would change the features, and transformers' extractor
    takes its own rate only."""
    if not isinstance(source, (bytes, bytearray)):
        source = Path(source).expanduser()
        if not source.is_file():
            raise MediaError(f"audio {source}: no such file")
    try:
        handle = wave.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source))
    except (wave.Error, EOFError) as e:
        return _read_other(source, f"not a PCM WAV file ({e})", rate)
    with handle:
        found, channels, width = handle.getframerate(), handle.getnchannels(), handle.getsampwidth()
        raw = handle.readframes(handle.getnframes())
    _check_rate(found, rate)
    raw = raw[: len(raw) - len(raw) % (width * channels)]  # a file cut short ends mid-frame: not a sample
    if width == 1:
        samples = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    elif width in (2, 4):
        dtype = np.int16 if width == 2 else np.int32
        samples = np.frombuffer(raw, dtype).astype(np.float32) / float(2 ** (8 * width - 1))
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        value = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        samples = (np.where(value >= 1 << 23, value - (1 << 24), value) / float(1 << 23)).astype(np.float32)
    else:
        raise MediaError(f"WAV samples of {8 * width} bits are not supported")
    return samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)


def _read_other(source: Union[Path, bytes], not_wav: str, rate: int) -> np.ndarray:
    """FLAC, OGG, MP3 (what libsndfile reads) through soundfile, the optional `audio` extra."""
    try:
        import soundfile
    except ImportError:
        raise MediaError(f"{not_wav}; other formats (FLAC, OGG, MP3) need soundfile: pip install "
                         f"\"mlx-spec[audio]\", or convert to {rate / 1000:g} kHz WAV first") from None
    try:
        samples, found = soundfile.read(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source,
                                       dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError or TypeError by format
        # (its words name the BytesIO object, at its address, where the audio came as bytes)
        said = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "the data", str(e))
        raise MediaError(f"{not_wav} nor a format soundfile reads ({said}); convert to {rate / 1000:g} kHz WAV "
                         "first") from None
    _check_rate(found, rate)
    return samples.mean(axis=1, dtype=np.float32)


def _check_rate(found: int, rate: int) -> None:
    if found != rate:
        raise MediaError(f"audio at {found} Hz: Gemma 4 takes {rate} Hz; resample it first")


def read_audio(source, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at `rate` from a WAV path or bytes, a (samples, rate) pair or samples."""
    if isinstance(source, (str, Path, bytes, bytearray)):
        return read_wav(bytes(source) if isinstance(source, bytearray) else source, rate)
    if isinstance(source, tuple) and len(source) == 2:
        samples, found = source
        _check_rate(found, rate)
        source = samples
    try:
        samples = np.asarray(source, dtype=np.float32)
    except (TypeError, ValueError):  # (a dict, strings: numpy's own words named no audio)
        raise MediaError(f"audio must be a WAV file's path or bytes, a (samples, rate) pair or samples; got "
                         f"{type(source).__name__}") from None
    if samples.ndim == 2:  # (samples, channels)
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise MediaError(f"audio samples must be 1-D (or samples x channels), got shape {samples.shape}")
    return samples


@lru_cache(maxsize=8)
def _mel_filters(settings: MelSettings) -> np.ndarray:
    """[fft_length // 2 + 1, mel_bands] triangular HTK mel filters from min_frequency to
    max_frequency, unnormalised."""
    def to_mel(hz):
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    mels = np.linspace(to_mel(settings.min_frequency), to_mel(settings.max_frequency), settings.mel_bands + 2)
    edges = 700.0 * (np.power(10, mels / 2595.0) - 1.0)
    bins = np.linspace(0, settings.sampling_rate // 2, settings.fft_length // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down, up = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(down, up))


@lru_cache(maxsize=8)
def _window(frame_length: int) -> np.ndarray:
    return np.hanning(frame_length + 1)[:-1].astype(np.float32)  # periodic Hann


def audio_features(samples: np.ndarray, settings: MelSettings = MEL) -> AudioFeatures:
    """Log-mel features and their mask for one clip of mono samples at the settings' rate (see
    the module)."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)[:MAX_SAMPLES]
    if samples.size == 0:
        raise MediaError("the audio is empty")
    if not np.isfinite(samples).all():
        raise MediaError("the audio has samples that are not finite numbers")
    frame, hop = settings.frame_length, settings.hop_length
    padded = -(-samples.size // PAD_TO) * PAD_TO
    valid = np.zeros(frame // 2 + padded, dtype=bool)
    valid[frame // 2: frame // 2 + samples.size] = True
    wave_ = np.zeros(frame // 2 + padded, dtype=np.float32)
    wave_[frame // 2: frame // 2 + samples.size] = samples
    count = (wave_.size - (frame + 1)) // hop + 1
    if count <= 0:
        raise MediaError(f"the audio is too short: {samples.size} samples")
    starts = np.arange(count) * hop
    frames = wave_[starts[:, None] + np.arange(frame)] * _window(frame)
    magnitude = np.abs(np.fft.rfft(frames, n=settings.fft_length, axis=-1))
    features = np.log(magnitude @ _mel_filters(settings) + np.float64(settings.mel_floor)).astype(np.float32)
    mask = valid[starts + frame]  # the frame's last sample (of frame + 1, as transformers unfolds)
    return AudioFeatures(features * mask[:, None], mask)


def audio_tokens(sample_count: int, settings: MelSettings = MEL) -> int:
    """Soft tokens of a clip in the prompt: its mel frames after the tower's two stride-2
    convolutions, at most the settings' `max_tokens` (the processor's `audio_seq_length`)."""
    frame, hop = settings.frame_length, settings.hop_length
    frames = (sample_count + frame // 2 - (frame + 1)) // hop + 1
    if frames <= 0:
        return 0
    for _ in range(SUBSAMPLING):
        frames = (frames + 2 - 3) // 2 + 1
    return min(frames, settings.max_tokens)
