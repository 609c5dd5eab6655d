"""Audio as Gemma 4's audio tower takes it, as transformers' `Gemma4AudioFeatureExtractor` makes
it: 16 kHz mono samples in [-1, 1], padded to a multiple of 128 samples (at most 30 s: longer
audio is cut, as there), framed semi-causally (20 ms frames every 10 ms, half a frame of silence
before the first), a periodic Hann window, the magnitude of a 512-point FFT, 128 HTK mel bands
from 0 to 8 kHz, and the log of (mel + 0.001). Frames that reach into the padding are masked and
zeroed. WAV files are read with the standard library; other formats (FLAC, OGG, MP3) with
soundfile where it is installed (an optional extra: `pip install "mlx-spec[audio]"`).
"""

import io
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np

from ..errors import MediaError

SAMPLE_RATE = 16_000
MAX_SAMPLES = 480_000  # 30 s: the feature extractor's max_length, beyond which it truncates
PAD_TO = 128
FRAME = 320  # 20 ms
HOP = 160  # 10 ms
FFT = 512
MEL_BANDS = 128
MEL_FLOOR = 1e-3
# The audio tower's two stride-2 convolutions (kernel 3, padding 1) over the mel frames.
SUBSAMPLING = 2




@dataclass
class AudioFeatures:
    features: np.ndarray  # [frames, 128] float32 log-mel, zero where masked
    mask: np.ndarray  # [frames] bool: frames wholly inside the audio


def read_wav(source: Union[str, Path, bytes]) -> np.ndarray:
    """An audio file (path or bytes) as 16 kHz mono float32 samples in [-1, 1]: PCM WAV (8, 16,
    24 or 32 bits, any channel count) by the standard library, another format through soundfile
    where it is installed. Other rates are refused with the rate named: resampling would change
    the features, and transformers' extractor takes 16 kHz only."""
    if not isinstance(source, (bytes, bytearray)):
        source = Path(source).expanduser()
        if not source.is_file():
            raise MediaError(f"audio {source}: no such file")
    try:
        handle = wave.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source))
    except (wave.Error, EOFError) as e:
        return _read_other(source, f"not a PCM WAV file ({e})")
    with handle:
        rate, channels, width = handle.getframerate(), handle.getnchannels(), handle.getsampwidth()
        raw = handle.readframes(handle.getnframes())
    _check_rate(rate)
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


def _read_other(source: Union[Path, bytes], not_wav: str) -> np.ndarray:
    """FLAC, OGG, MP3 (what libsndfile reads) through soundfile, the optional `audio` extra."""
    try:
        import soundfile
    except ImportError:
        raise MediaError(f"{not_wav}; other formats (FLAC, OGG, MP3) need soundfile: pip install "
                         f"\"mlx-spec[audio]\", or convert to 16 kHz WAV first") from None
    try:
        samples, rate = soundfile.read(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source,
                                       dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError or TypeError by format
        raise MediaError(f"{not_wav} nor a format soundfile reads ({e}); convert to 16 kHz WAV first") from None
    _check_rate(rate)
    return samples.mean(axis=1, dtype=np.float32)


def _check_rate(rate: int) -> None:
    if rate != SAMPLE_RATE:
        raise MediaError(f"audio at {rate} Hz: Gemma 4 takes 16000 Hz; resample it first")


def read_audio(source) -> np.ndarray:
    """16 kHz mono float32 samples from a WAV path or bytes, a (samples, rate) pair or samples."""
    if isinstance(source, (str, Path, bytes, bytearray)):
        return read_wav(bytes(source) if isinstance(source, bytearray) else source)
    if isinstance(source, tuple) and len(source) == 2:
        samples, rate = source
        _check_rate(rate)
        source = samples
    samples = np.asarray(source, dtype=np.float32)
    if samples.ndim == 2:  # (samples, channels)
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise MediaError(f"audio samples must be 1-D (or samples x channels), got shape {samples.shape}")
    return samples


def _mel_filters() -> np.ndarray:
    """[FFT // 2 + 1, 128] triangular HTK mel filters over 0-8 kHz, unnormalised."""
    def to_mel(hz):
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    mels = np.linspace(to_mel(0.0), to_mel(8000.0), MEL_BANDS + 2)
    edges = 700.0 * (np.power(10, mels / 2595.0) - 1.0)
    bins = np.linspace(0, SAMPLE_RATE // 2, FFT // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down, up = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(down, up))


_WINDOW = np.hanning(FRAME + 1)[:-1].astype(np.float32)  # periodic Hann
_FILTERS = _mel_filters()


def audio_features(samples: np.ndarray) -> AudioFeatures:
    """Log-mel features and their mask for one clip of 16 kHz mono samples (see the module)."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)[:MAX_SAMPLES]
    if samples.size == 0:
        raise MediaError("the audio is empty")
    if not np.isfinite(samples).all():
        raise MediaError("the audio has samples that are not finite numbers")
    padded = -(-samples.size // PAD_TO) * PAD_TO
    valid = np.zeros(FRAME // 2 + padded, dtype=bool)
    valid[FRAME // 2: FRAME // 2 + samples.size] = True
    wave_ = np.zeros(FRAME // 2 + padded, dtype=np.float32)
    wave_[FRAME // 2: FRAME // 2 + samples.size] = samples
    count = (wave_.size - (FRAME + 1)) // HOP + 1
    if count <= 0:
        raise MediaError(f"the audio is too short: {samples.size} samples")
    starts = np.arange(count) * HOP
    frames = wave_[starts[:, None] + np.arange(FRAME)] * _WINDOW
    magnitude = np.abs(np.fft.rfft(frames, n=FFT, axis=-1))
    features = np.log(magnitude @ _FILTERS + MEL_FLOOR).astype(np.float32)
    mask = valid[starts + FRAME]  # the frame's last sample (of FRAME + 1, as transformers unfolds)
    return AudioFeatures(features * mask[:, None], mask)


def audio_tokens(sample_count: int, max_tokens: int = 750) -> int:
    """Soft tokens of a clip in the prompt: its mel frames after the tower's two stride-2
    convolutions, at most `max_tokens` (the processor's `audio_seq_length`)."""
    frames = (sample_count + FRAME // 2 - (FRAME + 1)) // HOP + 1
    if frames <= 0:
        return 0
    for _ in range(SUBSAMPLING):
        frames = (frames + 2 - 3) // 2 + 1
    return min(frames, max_tokens)

