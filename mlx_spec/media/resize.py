"""Torch's uint8 antialiased bicubic resize, in numpy.

Why this exists: the only image processor transformers has for the Gemma 4 12B
(`Gemma4UnifiedImageProcessor`) resizes with torchvision's
`tvF.resize(uint8 CHW tensor, interpolation=BICUBIC, antialias=True)`, which on CPU is
`torch.nn.functional.interpolate(mode="bicubic", align_corners=False, antialias=True)` run on
the uint8 tensor itself: aten's native uint8 kernel. That kernel starts from Pillow's weights
but rounds differently from Pillow's own bicubic resize: Pillow's output is off by 1 level in a
fraction of the pixels, and by 10-20 levels on sharp content where the width is upscaled and the
height downscaled, since Pillow's pass order and rounding differ (Pillow keeps 22 fractional bits
and its intermediate there is not torch's).
mlx-spec may not depend on torch, so this module redoes the kernel's arithmetic exactly.

What torch computes, for each axis that changes size (an axis that keeps its size is skipped):

- scale = in_size / out_size. The filter is Keys' cubic with a = -0.5 (Pillow's, not the
  a = -0.75 of torch's non-antialiased bicubic), stretched by the scale when downscaling:
  support = 2 · max(scale, 1) input pixels either side of the centre.
- Output pixel i reads input pixels [xmin, xmin + xsize) around centre = scale · (i + 0.5),
  weighted filter((x - centre + 0.5) / max(scale, 1)), normalised to sum to one, in double.
- The weights become integers scaled by 2^p, rounded half away from zero, where p is the
  largest precision (at most 22) at which the axis's largest weight still rounds below 2^15.
- Each output value is (2^(p-1) + Σ pixel · weight) >> p in int32, saturated to 0..255.
- The width is resampled first, into a uint8 image, and the height from that.

CPU capability: with at most 4 channels at the AVX2 or AVX512 capability torch runs its AVX2
kernel (UpSampleKernelAVXAntialias.h); otherwise (more channels, or ATEN_CPU_CAPABILITY=default)
its generic separable kernel (UpSampleKernel.cpp). Both share the weights, the pass order and
the integer arithmetic, and this module matches both, with one exception that is a torch bug
and is not reproduced: the generic kernel, for an output 1 pixel wide whose height changes,
repeats its first output row down the whole column. (Torch's AVX2 kernel also refuses a 1x1
output for a 3-channel CHW input.) The 12B's images have 3 channels and are far wider.
"""

import numpy as np

_A = -0.5  # Keys' cubic parameter of Pillow's bicubic filter, which torch's antialias path follows
_TAPS = 4  # the cubic filter's width in input pixels at scale 1


def bicubic_antialiased(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """`pixels` [H, W, C] uint8 resized to [height, width, C] uint8, bit for bit as torch's
    `interpolate(mode="bicubic", antialias=True, align_corners=False)` on uint8."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(f"expected an [H, W, C] uint8 array, got {pixels.dtype} {pixels.shape}")
    if height < 1 or width < 1:
        raise ValueError(f"cannot resize to {height}x{width}")
    out = pixels
    # Torch resamples the last (contiguous) axis first, then the other one, and skips an axis
    # whose size does not change: the order matters because the intermediate is uint8.
    if width != out.shape[1]:
        out = _resample_axis(out, width, axis=1)
    if height != out.shape[0]:
        out = _resample_axis(out, height, axis=0)
    return out.copy() if out is pixels else out


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel, written in the same operation order as aten's so the
    double results agree to the last bit."""
    x = np.abs(x)
    near = ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0
    far = ((_A * x - 5.0 * _A) * x + 8.0 * _A) * x - 4.0 * _A
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _axis_weights(in_size: int, out_size: int):
    """One axis's taps: each output index's first input index, its weights as integers
    scaled by 2^p ([out, taps], int16 values held as int32, zero past the window), and p."""
    scale = in_size / out_size
    support = _TAPS * 0.5 * scale if scale >= 1.0 else _TAPS * 0.5
    taps = int(np.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0

    centre = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    # C casts to int64, which truncates toward zero (not floor) before the clamp to 0.
    xmin = np.maximum(np.trunc(centre - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(centre + support + 0.5).astype(np.int64), in_size)
    xsize = np.clip(xmax - xmin, 0, taps)

    j = np.arange(taps)
    inside = j[None, :] < xsize[:, None]
    # (j + xmin) is an integer sum in C; the rest is left to right in double.
    x = ((j[None, :] + xmin[:, None]).astype(np.float64) - centre[:, None] + 0.5) * invscale
    w = np.where(inside, _cubic(x), 0.0)

    # Sum tap by tap, as the C loop does: numpy's pairwise sum could round differently.
    total = np.zeros(out_size)
    for k in range(taps):
        total = total + w[:, k]
    nonzero = total != 0.0
    w = np.where(nonzero[:, None], w / np.where(nonzero, total, 1.0)[:, None], w)
    wt_max = float(w[nonzero].max(initial=0.0))

    # The largest p <= 22 at which the largest weight · 2^p still rounds below 2^15 (int16):
    # the C loop stops at the first p whose next step would reach it.
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1

    v = w * float(1 << precision)  # exact: a power of two
    weights = np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int32)
    return xmin, weights, precision


def _resample_axis(pixels: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One separable pass of torch's uint8 kernel along `axis` (0: rows, 1: columns)."""
    in_size = pixels.shape[axis]
    xmin, weights, precision = _axis_weights(in_size, out_size)
    shape = [1, 1, 1]
    shape[axis] = out_size
    out_shape = list(pixels.shape)
    out_shape[axis] = out_size
    # int32 like the C accumulator; starting at 2^(p-1) makes the final shift round to nearest.
    acc = np.full(out_shape, 1 << (precision - 1), dtype=np.int32)
    term = np.empty(out_shape, dtype=np.int32)
    # One gather per tap, vectorised over the whole image; a tap past an output's window has
    # weight 0, so its (clamped) index reads a real pixel that adds nothing.
    for k in range(weights.shape[1]):
        index = np.minimum(xmin + k, in_size - 1)
        np.multiply(np.take(pixels, index, axis=axis), weights[:, k].reshape(shape), out=term)
        acc += term
    return np.clip(acc >> precision, 0, 255).astype(np.uint8)
