"""`bicubic_antialiased` gives torch's uint8 antialiased bicubic resize bit for bit.

Torch is the oracle because it is the call the 12B's image processor ends in: transformers'
`Gemma4UnifiedImageProcessor` resizes with torchvision's `tvF.resize(uint8 image,
interpolation=BICUBIC, antialias=True)`, and torchvision's `resize_image` (read from its
source; the processor itself, torchvision and all, is run in test_media_preprocessing.py) hands a uint8 CPU image
straight to `torch.nn.functional.interpolate(mode="bicubic", align_corners=False,
antialias=True)`, keeping the uint8 dtype, and returns the image itself when the size is
unchanged. The comparisons are exact (`np.array_equal`), on noise (the worst case for any
rounding disagreement) and on smooth gradients, 1 and 3 channels, both memory layouts.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlx_spec.media.resize import bicubic_antialiased

torch = pytest.importorskip("torch", reason="torch (transformers, the oracle) is not installed: pip install torch")


def torch_resize(pixels: np.ndarray, height: int, width: int, channels_last: bool = False) -> np.ndarray:
    """The oracle: torch on the [1, C, H, W] uint8 tensor, back to [H, W, C]. channels_last is
    the layout torchvision sees for an HWC array permuted to CHW without a copy."""
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None]
    if not channels_last:
        image = image.contiguous()
    out = torch.nn.functional.interpolate(
        image, size=[height, width], mode="bicubic", align_corners=False, antialias=True
    )
    return out[0].permute(1, 2, 0).numpy()


def noise(height, width, channels, seed):
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def gradient(height, width, channels, seed):
    """Smooth ramps in different directions, one per channel: no clipping, many exact halves."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    angle = np.random.default_rng(seed).uniform(0, np.pi)
    ramps = [x * np.cos(angle + c) + y * np.sin(angle + c) for c in range(channels)]
    ramps = [(r - r.min()) * 255 / max(np.ptp(r), 1e-9) for r in ramps]
    return np.stack(ramps, axis=-1).round().astype(np.uint8)


def assert_same(ours, expected):
    assert ours.dtype == np.uint8 and ours.shape == expected.shape
    if not np.array_equal(ours, expected):
        diff = np.abs(ours.astype(int) - expected.astype(int))
        pytest.fail(f"{(diff > 0).sum()} of {diff.size} values differ, by up to {diff.max()}")


# (input H, W) -> (output H, W), named by what they exercise.
EDGE_CASES = {
    "down both": ((480, 640), (336, 448)),
    "up both": ((30, 40), (97, 131)),
    "down height, up width": ((200, 60), (50, 240)),
    "up height, down width": ((60, 200), (240, 50)),
    "width unchanged": ((90, 70), (37, 70)),
    "height unchanged": ((90, 70), (90, 151)),
    "single row in": ((1, 40), (3, 17)),
    "single column in": ((40, 1), (9, 5)),
    "single pixel in": ((1, 1), (4, 6)),
    "single row out": ((30, 20), (1, 13)),
    "tiny": ((3, 5), (5, 3)),
    "extreme downscale": ((2, 3000), (2, 7)),
    "extreme upscale": ((2, 3), (211, 5)),
    "one pixel more": ((100, 100), (101, 99)),
    "non-integer ratio": ((768, 1024), (672, 896)),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["chw", "channels_last"])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("make", [noise, gradient])
@pytest.mark.parametrize("case", list(EDGE_CASES), ids=list(EDGE_CASES))
def test_edge_cases_match_torch(case, make, channels, channels_last):
    (h_in, w_in), (h_out, w_out) = EDGE_CASES[case]
    pixels = make(h_in, w_in, channels, seed=h_in * 7 + w_in)
    assert_same(
        bicubic_antialiased(pixels, h_out, w_out), torch_resize(pixels, h_out, w_out, channels_last)
    )


def sweep(count=50, seed=1234):
    """Seeded size pairs: each axis independently shrunk, grown or kept, over 1..400 pixels."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        sizes = []
        for _axis in range(2):
            n = int(rng.integers(1, 400))
            kind = rng.choice(["down", "up", "same"], p=[0.45, 0.45, 0.1])
            m = {"down": int(rng.integers(1, n + 1)), "up": int(rng.integers(n, 2 * n + 40)), "same": n}[kind]
            sizes.append((n, m))
        (h_in, h_out), (w_in, w_out) = sizes
        pairs.append(((h_in, w_in), (h_out, w_out)))
    return pairs


@pytest.mark.parametrize("index, pair", list(enumerate(sweep())), ids=lambda v: str(v))
def test_sweep_matches_torch(index, pair):
    (h_in, w_in), (h_out, w_out) = pair
    make = noise if index % 2 == 0 else gradient
    channels = 3 if index % 3 else 1
    pixels = make(h_in, w_in, channels, seed=index)
    assert_same(bicubic_antialiased(pixels, h_out, w_out), torch_resize(pixels, h_out, w_out))


def test_large_photo_sized_image_matches_torch():
    """A 2000x3000 photo down to the 12B's budget: the sizes the processor actually sees."""
    pixels = noise(2000, 3000, 3, seed=7)
    assert_same(bicubic_antialiased(pixels, 624, 432), torch_resize(pixels, 624, 432, channels_last=True))


@pytest.mark.parametrize("size", [(40, 17), (3, 90), (64, 64)])
def test_more_than_four_channels_matches_torch_generic_kernel(size):
    """Torch's AVX kernel takes at most 4 channels; 5 goes through its generic kernel."""
    pixels = noise(50, 33, 5, seed=size[0])
    assert_same(bicubic_antialiased(pixels, *size), torch_resize(pixels, *size))


def test_same_size_is_an_unchanged_copy():
    pixels = noise(12, 9, 3, seed=0)
    out = bicubic_antialiased(pixels, 12, 9)
    assert np.array_equal(out, pixels) and out is not pixels
    assert_same(out, torch_resize(pixels, 12, 9))


def test_rejects_what_it_cannot_resize():
    with pytest.raises(ValueError, match=r"expected an \[H, W, C\] uint8 array, got float32"):
        bicubic_antialiased(np.zeros((4, 4, 3), np.float32), 2, 2)
    with pytest.raises(ValueError, match=r"expected an \[H, W, C\] uint8 array, got uint8 \(4, 4\)"):
        bicubic_antialiased(np.zeros((4, 4), np.uint8), 2, 2)
    with pytest.raises(ValueError, match="cannot resize to 0x2"):
        bicubic_antialiased(np.zeros((4, 4, 3), np.uint8), 0, 2)


GENERIC_SCRIPT = """
import sys, numpy as np, torch
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT", torch.backends.cpu.get_cpu_capability()
cases = np.load(sys.argv[1], allow_pickle=True)["cases"]
results = {}
for i, (pixels, (h, w)) in enumerate(cases):
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None].contiguous()
    out = torch.nn.functional.interpolate(image, size=[h, w], mode="bicubic", align_corners=False, antialias=True)
    results[str(i)] = out[0].permute(1, 2, 0).numpy()
np.savez(sys.argv[2], **results)
"""


def test_matches_torch_at_the_default_cpu_capability(tmp_path):
    """Torch without AVX runs its generic separable kernel even for 3 channels: same answer.
    (Not an output 1 pixel wide whose height changes: there that kernel repeats its first
    output row down the column, a torch bug this module does not copy.)"""
    cases = [(noise(h, w, c, seed=i), size) for i, ((h, w), size, c) in enumerate([
        ((480, 640), (336, 448), 3), ((200, 60), (50, 240), 3), ((60, 200), (240, 50), 1),
        ((1, 1), (4, 6), 3), ((3, 5), (5, 3), 1), ((2, 3000), (2, 7), 3), ((90, 70), (37, 70), 3),
    ])]
    cases += [(gradient(h, w, 3, seed=i), out) for i, ((h, w), out) in enumerate(sweep(12, seed=99))
              if out[1] != 1]
    inputs, outputs = tmp_path / "cases.npz", tmp_path / "torch.npz"
    packed = np.empty(len(cases), dtype=object)
    packed[:] = cases
    np.savez(inputs, cases=packed)
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    subprocess.run([sys.executable, "-c", GENERIC_SCRIPT, str(inputs), str(outputs)],
                   env=env, check=True, cwd=Path(__file__).parent, timeout=120)
    expected = np.load(outputs)
    for i, (pixels, (h, w)) in enumerate(cases):
        assert_same(bicubic_antialiased(pixels, h, w), expected[str(i)])
