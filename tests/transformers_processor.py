"""Save transformers' own Gemma 4 processor into a tiny checkpoint, load it back from there, and
run it on prompts: `python transformers_processor.py SPEC.json`. SPEC names the checkpoint
folder, the family ("gemma4": `Gemma4Processor`; "gemma4_unified": the 12B's
`Gemma4UnifiedProcessor`), the settings of its image processor, feature extractor and the
processor itself, and the cases to run (chat messages, image files, audio as .npy files,
processor keyword arguments); it writes each case's arrays to SPEC's "out" (.npz).

The processor is built, saved with `save_pretrained` and read back with `AutoProcessor`: the
files on disk are transformers' own, and so is what it makes of them. A process of its own
because a processor needs torchvision (its video processor; the 12B's image processor), which
the test puts on PYTHONPATH for this process alone (unified_processor.py says why).
"""

import json
import sys

import numpy as np
import torch.library

torch.library.register_fake = lambda *args, **kwargs: (lambda kernel: kernel)  # see unified_processor.py

import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer  # noqa: E402

# The tokenizer attributes Gemma 4's processors read (the real tokenizer_config.json names them).
MEDIA_TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
CLASSES = {
    "gemma4": ("Gemma4Processor", "Gemma4ImageProcessorPil", "Gemma4AudioFeatureExtractor", "Gemma4VideoProcessor"),
    "gemma4_unified": ("Gemma4UnifiedProcessor", "Gemma4UnifiedImageProcessor", "Gemma4UnifiedAudioFeatureExtractor",
                       "Gemma4UnifiedVideoProcessor"),
}


def save(spec: dict) -> None:
    processor, image, audio, video = (getattr(transformers, name) for name in CLASSES[spec["family"]])
    tokenizer = AutoTokenizer.from_pretrained(spec["folder"], extra_special_tokens=MEDIA_TOKENS)
    made = processor(feature_extractor=audio(**spec["feature_extractor"]),
                     image_processor=image(**spec["image_processor"]), tokenizer=tokenizer, video_processor=video(),
                     chat_template=tokenizer.chat_template, **spec["processor"])
    made.save_pretrained(spec["folder"])


def run(processor, case: dict) -> dict:
    text = processor.apply_chat_template(case["messages"], add_generation_prompt=True, enable_thinking=False,
                                         tokenize=False)
    images = [Image.open(path) for path in case.get("images", [])]
    audio = [np.load(path) for path in case.get("audio", [])]
    result = processor(text=[text], images=[images] if images else None, audio=audio or None, return_tensors="np",
                       **case.get("kwargs", {}))
    return {key: np.asarray(value) for key, value in result.items()}


def main(path: str) -> None:
    with open(path) as f:
        spec = json.load(f)
    save(spec)
    processor = AutoProcessor.from_pretrained(spec["folder"])
    if spec.get("image_backend"):
        # With torchvision present AutoProcessor takes E2B-31B's torchvision image processor;
        # mlx-spec makes the PIL one's pixels (images.py). Read from the same file.
        processor.image_processor = AutoImageProcessor.from_pretrained(spec["folder"], backend=spec["image_backend"])
    arrays = {"image_processor_class": np.asarray(type(processor.image_processor).__name__)}
    for name, case in spec["cases"].items():
        arrays.update({f"{name}/{key}": value for key, value in run(processor, case).items()})
    np.savez(spec["out"], **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
