"""Images and audio become the arrays transformers' own processors make: its PIL image processor
(`Gemma4ImageProcessorPil`, E2B to 31B), the 12B's torchvision one (run in a process of its
own, beside a torchvision this test installs aside), and its audio
feature extractor, on several sizes, shapes and lengths; the audio token count is the
processor's rule."""

import io
import os
import subprocess
import sys
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from mlx_spec.errors import MediaError
from mlx_spec.media import audio_features, audio_tokens, image_patches, read_image, read_wav
from mlx_spec.media.images import patchify, resized_pixels

# (width, height): square, wide, tall, tiny, larger than the budget, thin enough for the edge rule.
SIZES = [(224, 224), (640, 360), (300, 800), (50, 40), (1600, 1200), (1000, 30), (20, 700)]


def picture(width, height, seed=0):
    """A photo-like image: smooth gradients plus noise, so resampling has something to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width, 1), y * 255 / max(height, 1), (x + y) % 256], axis=-1)
    return Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("budget", [70, 280, 1120])
def test_image_patches_equal_transformers(size, budget):
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    image = picture(*size, seed=size[0])
    expected = Gemma4ImageProcessorPil(max_soft_tokens=budget)(image, return_tensors="np")
    ours = image_patches(image, max_soft_tokens=budget)
    n = ours.pixels.shape[0]
    assert ours.soft_tokens == expected["num_soft_tokens_per_image"][0]
    assert ours.pixels.dtype == expected["pixel_values"].dtype
    assert np.array_equal(ours.pixels, expected["pixel_values"][0, :n])
    assert np.array_equal(ours.positions, expected["image_position_ids"][0, :n])
    assert (expected["image_position_ids"][0, n:] == -1).all()  # the rest is transformers' padding


def test_the_12b_patches_equal_transformers_torchvision_processor(torchvision_path, tmp_path):
    """The 12B's processor resizes with torchvision (torch's uint8 kernel, not Pillow's filter),
    rescales in float32 and merges 3 x 3 blocks of 16-pixel patches: the same array, bit for bit,
    as our 48-pixel patches of the image resized by resize.py, on photo-like and noise images, at
    the smallest, default and largest budgets."""
    budgets = (70, 280, 1120)
    images = [picture(*size, seed=size[1]) for size in SIZES]
    images.append(Image.fromarray(np.random.default_rng(1).integers(0, 256, (500, 200, 3), dtype=np.uint8)))
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"image{i}.png")
        image.save(paths[-1])
    out = tmp_path / "expected.npz"
    env = {**os.environ, "PYTHONPATH": str(torchvision_path)}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("unified_processor.py")), str(out),
                          ",".join(map(str, budgets)), *map(str, paths)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = np.load(out)
    for budget in budgets:
        for i, path in enumerate(paths):
            pixels = resized_pixels(Image.open(path), budget, 16, 3, backend="torchvision")
            ours, positions = patchify(pixels, 48)
            theirs, their_positions = expected[f"pixels-{budget}-{i}"], expected[f"positions-{budget}-{i}"]
            n = len(ours)
            assert n == int(expected[f"tokens-{budget}-{i}"])
            assert np.array_equal(ours, theirs[:n]), (budget, i, np.abs(ours - theirs[:n]).max())
            assert np.array_equal(positions, their_positions[:n])
            assert (their_positions[n:] == -1).all()  # the rest is transformers' padding


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])  # (P: a palette without transparency, as transformers reads it)
def test_a_transparent_image_is_over_white_as_transformers_takes_it(mode, tmp_path):
    """A PIL image with transparency, given as it is: transformers' processor puts it over white;
    ours dropped the alpha, so its transparent half was black (found by a review: dark text on a
    transparent background became black on black). From a file, both drop the alpha
    (transformers' `load_image`)."""
    from transformers.image_utils import load_image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    pixels = np.zeros((96, 128, 4), np.uint8)
    pixels[:, :64] = (200, 30, 30, 255)
    pixels[:, 64:, 3] = 0  # transparent black
    image = Image.fromarray(pixels, "RGBA")
    image = image if mode == "RGBA" else image.convert(mode)
    processor = Gemma4ImageProcessorPil(max_soft_tokens=70)
    expected = processor(image, return_tensors="np")["pixel_values"][0]
    ours = image_patches(image, max_soft_tokens=70).pixels
    assert np.array_equal(ours, expected[: ours.shape[0]])
    assert (ours.max() == 1.0) == (mode != "P")  # the transparent half over white
    path = tmp_path / "t.png"
    image.save(path)
    from_file = processor(load_image(str(path)), return_tensors="np")["pixel_values"][0]
    assert np.array_equal(image_patches(path, max_soft_tokens=70).pixels, from_file[: ours.shape[0]])


def test_images_from_every_source_are_the_same_image(tmp_path):
    image = picture(120, 90)
    path = tmp_path / "p.png"
    image.save(path)
    encoded = io.BytesIO()
    image.save(encoded, format="PNG")
    rgba = image.convert("RGBA")
    for source in (path, str(path), encoded.getvalue(), np.asarray(image), rgba):
        assert np.array_equal(np.asarray(read_image(source)), np.asarray(image))


def test_a_photo_s_exif_orientation_is_applied_as_transformers_applies_it(tmp_path):
    """A phone stores a portrait photo sideways, with an EXIF tag saying so: transformers'
    `load_image` turns it upright, and so does read_image (from a file or its bytes); a PIL image
    handed over is taken as it is, as transformers takes it."""
    from transformers.image_utils import load_image

    stored = picture(64, 32)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    path = tmp_path / "phone.jpg"
    stored.save(path, format="JPEG", exif=exif.tobytes(), quality=95)
    theirs = np.asarray(load_image(str(path)).convert("RGB"))
    assert theirs.shape == (64, 32, 3)
    for source in (path, path.read_bytes()):
        assert np.array_equal(np.asarray(read_image(source)), theirs)
    assert np.asarray(read_image(Image.open(path))).shape == (32, 64, 3)


def test_image_arrays_of_one_channel_and_of_bad_shapes(tmp_path):
    gray = np.asarray(picture(20, 10).convert("L"))
    assert np.array_equal(np.asarray(read_image(gray[:, :, None])), np.asarray(read_image(gray)))
    for bad in (np.zeros((4, 4, 5), np.uint8), np.zeros((0, 4, 3), np.uint8), np.zeros((4, 4, 2), np.uint8)):
        with pytest.raises(MediaError, match="image array must be uint8"):
            read_image(bad)
    thin = tmp_path / "thin.png"
    Image.new("L", (40_000, 1)).save(thin)  # within the megapixels, but resampling it takes gigabytes
    with pytest.raises(MediaError, match="pixels a side"):
        read_image(thin)


def test_a_wav_cut_short_mid_frame_reads_its_whole_frames(tmp_path):
    """A truncated upload ends mid-sample or mid-frame: the whole frames are read (it was a
    ValueError from numpy: a 500 from the server)."""
    clip = speech(0.05)
    whole = wav_bytes(clip, channels=2, width=2)
    for cut in (1, 3):
        read = read_wav(whole[:-cut])
        assert np.array_equal(read, read_wav(whole)[: read.size]) and read.size == clip.size - 1


def test_bad_images_are_refused_by_name(tmp_path):
    with pytest.raises(MediaError, match=r"no such file"):
        read_image(tmp_path / "missing.png")
    with pytest.raises(MediaError, match=r"not an image Pillow can read"):
        read_image(b"certainly not a PNG")
    with pytest.raises(MediaError, match=r"uint8 of shape"):
        read_image(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(MediaError, match=r"image_tokens must be one of 70, 140, 280, 560, 1120"):
        image_patches(picture(64, 64), max_soft_tokens=100)


def speech(seconds, seed=0):
    """A voice-like clip: a few harmonics that glide, with noise, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16_000
    clip = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.3 + rng.normal(0, 0.02, t.size)
    return clip.astype(np.float32)


# Lengths in samples: a multiple of 128 and not, shorter than a frame's worth after padding, and
# longer than the 30 s the extractor keeps.
@pytest.mark.parametrize("samples", [16_000, 16_001, 12_345, 700, 48_000 * 3 + 17, 490_000])
def test_audio_features_equal_transformers(samples):
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    clip = speech(samples / 16_000, seed=samples)[:samples]
    expected = Gemma4AudioFeatureExtractor()([clip], return_tensors="np")  # a batch of one, as the processor passes it
    ours = audio_features(clip)
    assert np.array_equal(ours.mask, expected["input_features_mask"][0])
    assert ours.features.dtype == np.float32
    assert np.array_equal(ours.features, expected["input_features"][0])


@pytest.mark.parametrize("samples", [1, 160, 161, 320, 16_000, 16_001, 480_000, 800_000])
def test_audio_token_count_is_the_processor_s(samples):
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    processor = SimpleNamespace(feature_extractor=Gemma4AudioFeatureExtractor(), audio_seq_length=750)
    expected = Gemma4Processor._compute_audio_num_tokens(processor, np.zeros(samples), 16_000)
    assert audio_tokens(samples) == expected


def wav_bytes(samples: np.ndarray, rate=16_000, channels=1, width=2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels), w.setsampwidth(width), w.setframerate(rate)
        scale = 2 ** (8 * width - 1) - 1
        ints = np.round(np.repeat(samples[:, None], channels, axis=1) * scale)
        if width == 1:
            data = (ints + 128).astype(np.uint8).tobytes()
        elif width == 3:
            data = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints.reshape(-1))
        else:
            data = ints.astype(np.int16 if width == 2 else np.int32).tobytes()
        w.writeframes(data)
    return out.getvalue()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_wav_files_read_as_mono_16k(width, channels, tmp_path):
    clip = speech(0.05)
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(clip, channels=channels, width=width))
    for source in (path, path.read_bytes()):
        read = read_wav(source)
        assert read.dtype == np.float32 and read.shape == clip.shape
        assert np.abs(read - clip).max() <= 2.0 / 2 ** (8 * width - 1) + 1e-6


def flac_bytes(samples: np.ndarray, rate=16_000, channels=1) -> bytes:
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.repeat(samples[:, None], channels, axis=1), rate, format="FLAC", subtype="PCM_16")
    return out.getvalue()


@pytest.mark.parametrize("channels", [1, 2])
def test_flac_reads_as_its_wav_does(channels, tmp_path):
    """Another format goes through soundfile (libsndfile's decoder, not ours) to the samples of
    the 16-bit WAV of the same clip (FLAC is lossless; the writers round to 16 bits apart by one
    step at most)."""
    pytest.importorskip("soundfile", reason="soundfile (the audio extra) is not installed")
    clip = speech(0.05)
    path = tmp_path / "a.flac"
    path.write_bytes(flac_bytes(clip, channels=channels))
    expected = read_wav(wav_bytes(clip, channels=channels))
    for source in (path, path.read_bytes()):
        read = read_wav(source)
        assert read.dtype == np.float32 and np.abs(read - expected).max() <= 1.5 / 2 ** 15
    with pytest.raises(MediaError, match=r"audio at 44100 Hz: Gemma 4 takes 16000 Hz"):
        read_wav(flac_bytes(clip, rate=44_100))


def test_without_soundfile_another_format_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "soundfile", None)  # as if it were not installed
    with pytest.raises(MediaError, match=r'not a PCM WAV file.*need soundfile: pip install "mlx-spec\[audio\]"'):
        read_wav(b"fLaC\x00\x00\x00\x22 not really")


def test_bad_audio_is_refused_by_name(tmp_path):
    with pytest.raises(MediaError, match=r"no such file"):
        read_wav(tmp_path / "missing.wav")
    with pytest.raises(MediaError, match=r"not a PCM WAV file.*convert to 16 kHz WAV"):
        read_wav(b"RIFF....not a wave at all")
    with pytest.raises(MediaError, match=r"audio at 44100 Hz: Gemma 4 takes 16000 Hz"):
        read_wav(wav_bytes(speech(0.01), rate=44_100))
    with pytest.raises(MediaError, match=r"the audio is empty"):
        audio_features(np.zeros(0))
    with pytest.raises(MediaError, match=r"not finite"):
        audio_features(np.array([0.0, np.nan] * 200))
