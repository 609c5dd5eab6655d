"""Images as Gemma 4's vision tower takes them, as transformers' PIL image processor
(`Gemma4ImageProcessorPil`) makes them: RGB, resized with their aspect ratio kept to the
largest size within the patch budget whose sides are multiples of a pooled patch, rescaled (by
1/255: to [0, 1]), and cut into patches with their (x, y) positions.

The budget is `max_soft_tokens` soft tokens per image (70, 140, 280, 560 or 1120; the
checkpoints' default is 280); each soft token pools `pooling_kernel_size`² patches. A
checkpoint's processor config may set the budget, the patch size, the pooling and the rescale
factor (processor.py reads them).
"""

import io
import math
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Tuple, Union

import numpy as np

from ..errors import MediaError
from .resize import bicubic_antialiased

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)
RESCALE = 1 / 255  # the image processors' rescale_factor
MAX_PIXELS = 64_000_000  # larger images are refused (the largest budget uses about 0.3 megapixels)
# Longer sides are refused too: a 1 x 64,000,000 image is within MAX_PIXELS, but shrinking its
# long side to a budget's few thousand pixels weighs some 20,000 source pixels per output pixel
# (gigabytes of resampling weights).
MAX_SIDE = 32_768


@dataclass
class ImagePatches:
    pixels: np.ndarray  # [patches, patch_size² · 3] float32 in [0, 1], row by row of patches
    positions: np.ndarray  # [patches, 2] int: (x, y) of each patch
    soft_tokens: int  # patches / pooling_kernel_size²: the image's tokens in the prompt


def read_image(source: Union[str, Path, bytes, np.ndarray, Any]):
    """A PIL image in RGB from a path, encoded bytes, an array (H, W[, C], uint8; C of 1, 3 or
    4) or a PIL image. A file's EXIF orientation is applied, as transformers' `load_image` does
    (a phone's photo is stored sideways with a tag saying so); a PIL image is taken as it is."""
    Image, UnidentifiedImageError = _pillow()
    from PIL import ImageOps

    if not isinstance(source, (Image.Image, np.ndarray, bytes, bytearray, str, PurePath)):
        raise MediaError(f"an image must be a path, encoded bytes, an array or a PIL image; got {type(source).__name__}")
    try:
        if isinstance(source, Image.Image):
            image = source
        elif isinstance(source, np.ndarray):
            image = Image.fromarray(_image_array(source))
        else:
            image = _opened(Image, source)
        if image.width * image.height > MAX_PIXELS or max(image.size) > MAX_SIDE or min(image.size) < 1:
            raise MediaError(f"a {image.width}x{image.height} image: images must have at most "
                             f"{MAX_PIXELS // 1_000_000} megapixels, and 1 to {MAX_SIDE} pixels a side")
        if not isinstance(source, (Image.Image, np.ndarray)):
            image = ImageOps.exif_transpose(image)  # (after the size check: it decodes the image)
        image.load()
    except UnidentifiedImageError as e:  # (of bytes, its words name a BytesIO object's address)
        raise MediaError("not an image Pillow can read" + (f" ({e})" if isinstance(source, (str, PurePath)) else
                                                           " (no image format it knows)")) from None
    except (OSError, Image.DecompressionBombError) as e:
        raise MediaError(f"not an image Pillow can read ({e})") from None
    if isinstance(source, Image.Image) and ("A" in image.getbands() or image.info.get("transparency") is not None):
        # As transformers' processors take a PIL image with transparency (`convert_to_rgb`): over
        # white, so that dark text on a transparent background stays readable. A file's or an
        # array's alpha is dropped, as its `load_image` drops it.
        return Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255)), image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def _opened(Image, source):
    if isinstance(source, (bytes, bytearray)):
        return Image.open(io.BytesIO(source))
    path = Path(source).expanduser()
    if not path.is_file():
        raise MediaError(f"image {source}: no such file")
    return Image.open(path)


def _image_array(array: np.ndarray) -> np.ndarray:
    shape = array.shape
    if array.dtype != np.uint8 or array.ndim not in (2, 3) or (array.ndim == 3 and shape[2] not in (1, 3, 4)) \
            or 0 in shape[:2]:
        raise MediaError(f"an image array must be uint8 of shape (H, W) or (H, W, C) with C of 1, 3 or 4, and H "
                         f"and W at least 1; got {array.dtype} {shape}")
    return array[:, :, 0] if array.ndim == 3 and shape[2] == 1 else array


def _pillow():
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise MediaError("images need Pillow: pip install pillow") from None
    return Image, UnidentifiedImageError


def target_size(height: int, width: int, patch_size: int, max_patches: int, pooling: int) -> Tuple[int, int]:
    """The largest (height, width) with the image's aspect ratio, at most `max_patches` patches,
    and sides that are multiples of `pooling · patch_size` (transformers' rule, edge cases
    included: a very thin image keeps one pooled patch on its short side)."""
    target_px = max_patches * patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = pooling * patch_size
    out_h = int(math.floor(factor * height / side)) * side
    out_w = int(math.floor(factor * width / side)) * side
    if out_h == 0 and out_w == 0:
        raise MediaError(f"a {width}x{height} image is too small to resize to patches of {side} pixels")
    longest = (max_patches // pooling**2) * side
    if out_h == 0:
        out_h, out_w = side, min(int(math.floor(width / height)) * side, longest)
    elif out_w == 0:
        out_h, out_w = min(int(math.floor(height / width)) * side, longest), side
    if out_h * out_w > target_px:
        raise MediaError(f"a {width}x{height} image does not fit {max_patches} patches of {patch_size} pixels")
    return out_h, out_w


def image_patches(image, max_soft_tokens: int = 280, patch_size: int = 16, pooling_kernel_size: int = 3,
                  rescale_factor: float = RESCALE) -> ImagePatches:
    """The patches of one image (see the module's docstring), without padding."""
    pixels = resized_pixels(image, max_soft_tokens, patch_size, pooling_kernel_size, rescale_factor=rescale_factor)
    patches, positions = patchify(pixels, patch_size)
    return ImagePatches(patches, positions, len(patches) // pooling_kernel_size**2)


def resized_pixels(image, max_soft_tokens: int, patch_size: int, pooling_kernel_size: int,
                   backend: str = "pil", rescale_factor: float = RESCALE) -> np.ndarray:
    """The image in RGB, resized to the patch budget and rescaled by `rescale_factor` (1/255: to
    [0, 1]): [H, W, 3] float32.

    `backend`: which of transformers' image processors to equal, as each size has them: "pil"
    (`Gemma4ImageProcessorPil`, E2B to 31B: Pillow's bicubic, rescaled in float64) or
    "torchvision" (the 12B's only one: torch's uint8 bicubic kernel (resize.py), rescaled in
    float32). The two round apart, by a level here and there and by a last bit."""
    if max_soft_tokens not in SOFT_TOKEN_BUDGETS:
        raise MediaError(f"image_tokens must be one of {', '.join(map(str, SOFT_TOKEN_BUDGETS))}, got {max_soft_tokens}")
    Image, _ = _pillow()
    image = read_image(image)
    max_patches = max_soft_tokens * pooling_kernel_size**2
    height, width = target_size(image.height, image.width, patch_size, max_patches, pooling_kernel_size)
    resized = (height, width) != (image.height, image.width)
    if backend == "torchvision":
        pixels = np.asarray(image)
        pixels = bicubic_antialiased(pixels, height, width) if resized else pixels
        return pixels.astype(np.float32) * np.float32(rescale_factor)  # torch's uint8 tensor * scale
    if resized:
        image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
    # Rescaled in float64 and stored as float32, as transformers' numpy rescale does.
    return (np.asarray(image, dtype=np.float64) * rescale_factor).astype(np.float32)


def patchify(pixels: np.ndarray, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Square patches of `size` pixels, row by row ([N, size² · 3], each patch's pixels row by
    row), and their (x, y) positions [N, 2]."""
    height, width, _ = pixels.shape
    rows, cols = height // size, width // size
    patches = pixels.reshape(rows, size, cols, size, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, size * size * 3)
    grid_x, grid_y = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
    return patches, np.stack([grid_x, grid_y], axis=-1).reshape(rows * cols, 2)
