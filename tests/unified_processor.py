"""Run transformers' Gemma 4 12B image processor (`Gemma4UnifiedImageProcessor`, whose only
backend is torchvision) on PNG files, in a process of its own: `python unified_processor.py
OUT.npz BUDGET,... IMAGE...` writes each budget's and image's pixel_values, positions and
soft-token count.

Its own process because torchvision, put on PYTHONPATH for it alone by the test, is a build for
CUDA torch: its C extension does not load beside the CPU torch the suite runs on, and its fake
(meta) kernel registrations for the detection ops (nms, roi_align, ...) then fail at import.
Resizing never touches those ops, so the registrations are skipped here; everything the
processor runs (torchvision's resize, transformers' rescale and patch merge) is their code.
"""

import sys

import numpy as np
import torch.library

torch.library.register_fake = lambda *args, **kwargs: (lambda kernel: kernel)

from PIL import Image  # noqa: E402
from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor  # noqa: E402

out, budgets, paths = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
arrays = {}
for budget in budgets:
    processor = Gemma4UnifiedImageProcessor(max_soft_tokens=int(budget))
    for i, path in enumerate(paths):
        result = processor(images=[Image.open(path)], return_tensors="np")
        arrays[f"pixels-{budget}-{i}"] = result["pixel_values"][0]
        arrays[f"positions-{budget}-{i}"] = result["image_position_ids"][0]
        arrays[f"tokens-{budget}-{i}"] = np.asarray(result["num_soft_tokens_per_image"][0])
np.savez(out, **arrays)
