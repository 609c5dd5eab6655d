"""A checkpoint's processor config decides how its images and audio become the prompt's soft
tokens: tiny multimodal checkpoints (E2B's towers, the 12B's embedders) with the processor
transformers' own `save_pretrained` writes, asking for 70 soft tokens per image (and, on E2B,
an audio extractor off its defaults), give the prompt tokens and arrays transformers' processor
makes when `AutoProcessor` reads it back from the folder (tests/transformers_processor.py), with
no image_tokens passed; a request's image_tokens still wins. Older flat files are read too, and
what is malformed or not implemented is refused by name."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import tiny
from mlx_spec import load
from mlx_spec.errors import MediaError
from mlx_spec.media.audio import audio_features, audio_tokens
from mlx_spec.media.loading import load_media
from test_media_preprocessing import speech
from test_media_prompt import picture

BUDGET = 70
# Per family: the processor's settings (the tiny models' patch sizes and poolings, which the
# encoder needs; on E2B an extractor whose settings survive transformers' save and reload) and
# the soft tokens the 40 x 56 picture makes at BUDGET and at 280.
FAMILIES = {
    "e2b": dict(family="gemma4", image_backend="pil", processor={"image_seq_length": BUDGET},
                image_processor={"max_soft_tokens": BUDGET, "patch_size": 4, "pooling_kernel_size": 3},
                feature_extractor={"mel_floor": 1e-5, "min_frequency": 60.0, "max_frequency": 7600.0,
                                   "fft_overdrive": True}, tokens=(63, 266)),
    "12b": dict(family="gemma4_unified", processor={"image_seq_length": BUDGET},
                image_processor={"max_soft_tokens": BUDGET, "patch_size": 4, "pooling_kernel_size": 2},
                feature_extractor={"feature_size": 64, "audio_samples_per_token": 64}, tokens=(63, 266)),
}
TEMPLATE_MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"},
                                                  {"type": "audio"}, {"type": "text", "text": "What is this?"}]}]


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory, torchvision_path):
    """(folder, transformers' arrays by case, family's settings): the checkpoint with the saved
    processor, and what that processor makes of the prompt with its own budget and with 280."""
    settings = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"processor-{request.param}")
    folder = tiny.build_target(root / "target", layout="google", variant=request.param)
    Image.fromarray(picture()).save(root / "picture.png")
    np.save(root / "clip.npy", speech(1.3))
    case = {"messages": TEMPLATE_MESSAGES, "images": [str(root / "picture.png")], "audio": [str(root / "clip.npy")]}
    spec = {key: value for key, value in settings.items() if key != "tokens"}
    spec.update(folder=str(folder), out=str(root / "expected.npz"), cases={
        "own": case, "280": {**case, "kwargs": {"images_kwargs": {"max_soft_tokens": 280}}}})
    (root / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("transformers_processor.py")),
                          str(root / "spec.json")], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(torchvision_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    expected = np.load(root / "expected.npz")
    return folder, {name: {key.split("/")[1]: expected[key] for key in expected.files if key.startswith(f"{name}/")}
                    for name in ("own", "280")}, settings


@pytest.fixture(scope="module")
def engine(saved):
    return load(str(saved[0]), None, force=True)


def messages(root: Path):
    parts = [{"type": "text", "text": "Look:"}, {"type": "image", "image": str(root / "picture.png")},
             {"type": "audio", "audio": np.load(root / "clip.npy")}, {"type": "text", "text": "What is this?"}]
    return [{"role": "user", "content": parts}]


def assert_as_transformers(prepared, expected):
    """The same token ids, and each item's arrays as transformers' processor made them (its
    image's patches unpadded)."""
    tokens, spans = prepared
    assert tokens == expected["input_ids"][0].tolist()
    image, audio = (s.item for s in spans)
    patches, positions = image.arrays
    assert np.array_equal(patches, expected["pixel_values"][0, : len(patches)])
    assert np.array_equal(positions, expected["image_position_ids"][0, : len(positions)])
    assert (expected["image_position_ids"][0, len(positions):] == -1).all()
    assert np.array_equal(audio.arrays[0], expected["input_features"][0])
    return image.tokens


def test_the_prompt_follows_the_checkpoints_processor(saved, engine):
    """No image_tokens passed: the image takes the processor config's 70-token budget, as the
    prompt transformers' processor makes from the same folder (the old 280 made 266 here)."""
    folder, expected, settings = saved
    soft_tokens = assert_as_transformers(engine.prepare(messages(folder.parent)), expected["own"])
    image_ids = expected["own"]["input_ids"] == tiny.MEDIA_IDS["<|image|>"]
    assert soft_tokens == settings["tokens"][0] == int(image_ids.sum())


def test_a_requests_image_tokens_still_wins(saved, engine):
    folder, expected, settings = saved
    soft_tokens = assert_as_transformers(engine.prepare(messages(folder.parent), image_tokens=280), expected["280"])
    assert soft_tokens == settings["tokens"][1]


TOWERS = {"model_type": "gemma4", "vision_config": {"patch_size": 4},
          "audio_config": {"subsampling_conv_channels": [128, 4]}}
UNIFIED = {"model_type": "gemma4_unified", "vision_config": {"patch_size": 4, "pooling_kernel_size": 2},
           "audio_config": {"audio_embed_dim": 64}}


def encoder(folder: Path, processor=None, preprocessor=None, config=TOWERS):
    """The media encoder of a checkpoint folder holding these processor files (JSON-able
    values, or text written as it is); items are made from the files and the config alone."""
    for name, content in (("processor_config.json", processor), ("preprocessor_config.json", preprocessor)):
        if content is not None:
            (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return load_media(folder, config)


def saved_extractor(**settings) -> dict:
    """A Gemma 4 audio feature extractor's settings as transformers saves them."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    return json.loads(Gemma4AudioFeatureExtractor(**settings).to_json_string())


@pytest.mark.parametrize("processor, message", [
    ("{not json", r"processor_config.json: not a readable JSON file"),
    ("[1, 2]", r"processor_config.json: must be a JSON object, got list"),
    ({"image_processor": "big"}, r"\(image_processor\): must be a JSON object, got str"),
    ({"image_processor": {"max_soft_tokens": 100}}, r"max_soft_tokens must be one of 70, 140, 280, 560, 1120, got 100"),
    ({"image_processor": {"max_soft_tokens": "70"}}, r"max_soft_tokens must be one of .*got '70'"),
    ({"image_processor": {"patch_size": 16}},
     r"patch_size 16 is not the vision encoder's \(vision_config.patch_size\) 4"),
    ({"image_processor": {"max_soft_tokens": 70}, "image_seq_length": 280},
     r"image_seq_length 280 disagrees with the image processor's max_soft_tokens 70"),
    ({"image_processor": {"image_processor_type": "SiglipImageProcessor"}}, r"'SiglipImageProcessor' is not Gemma 4's"),
    ({"feature_extractor": {"sampling_rate": "16k"}}, r"sampling_rate must be a positive integer, got '16k'"),
    ({"feature_extractor": {"feature_size": 80}}, r"feature_size 80 is not the audio tower's mel bands 128"),
    ({"audio_seq_length": 7.5}, r"audio_seq_length must be a positive integer, got 7.5"),
])
def test_a_malformed_processor_config_is_refused_by_name(tmp_path, processor, message):
    with pytest.raises(MediaError, match=message):
        encoder(tmp_path, processor)


@pytest.mark.parametrize("processor, message, config", [
    ({"image_processor": {"do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}},
     r"do_normalize true is not implemented; .*\(do_normalize false\)", TOWERS),
    ({"image_processor": {"resample": 2}}, r"resample 2 is not implemented", UNIFIED),
    ({"image_processor": {"do_rescale": False}}, r"do_rescale false is not implemented", TOWERS),
    ({"feature_extractor": saved_extractor(dither=1e-4)}, r"dither 0.0001 is not implemented", TOWERS),
    ({"feature_extractor": saved_extractor(preemphasis=0.97)}, r"preemphasis 0.97 is not implemented", TOWERS),
    ({"feature_extractor": saved_extractor(per_bin_mean=[0.0] * 128)}, r"per_bin_mean \[.*0.0.* is not implemented",
     TOWERS),
    # transformers saves a 25 ms frame as 400 samples, and reads the file back with 20 ms ones
    ({"feature_extractor": saved_extractor(frame_length_ms=25.0)}, r"frame_length 400 is not the 320 samples", TOWERS),
    ({"feature_extractor": {"audio_samples_per_token": 640}},
     r"audio_samples_per_token 640 is not the audio embedder's input \(audio_config.audio_embed_dim\) 64", UNIFIED),
    ({"feature_extractor": saved_extractor()}, r"'Gemma4AudioFeatureExtractor' is not Gemma 4's", UNIFIED),
])
def test_settings_mlx_spec_does_not_implement_are_refused_by_name(tmp_path, processor, message, config):
    with pytest.raises(MediaError, match=message):
        encoder(tmp_path, processor, config=config)


def test_the_older_flat_file_is_read_and_a_nested_one_wins(tmp_path):
    """preprocessor_config.json (one flat dict) where processor_config.json nests nothing, as
    transformers reads them; neither file: the image processors' defaults, as before."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    assert encoder(tmp_path).images.max_soft_tokens == 280
    flat = {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 140, "patch_size": 4}
    older = encoder(tmp_path, processor={"processor_class": "Gemma4Processor", "image_seq_length": 140},
                    preprocessor=flat)
    expected = Gemma4ImageProcessorPil(max_soft_tokens=140, patch_size=4)(Image.fromarray(picture()),
                                                                          return_tensors="np")
    assert older.image(picture()).tokens == expected["num_soft_tokens_per_image"][0] == 140
    nested = encoder(tmp_path, processor={"image_processor": {**flat, "max_soft_tokens": 560}})
    assert nested.images.max_soft_tokens == 560


@pytest.mark.parametrize("extractor", [
    dict(mel_floor=1e-5, min_frequency=125.0, max_frequency=7500.0),
    dict(fft_overdrive=True),
    dict(sampling_rate=8_000, max_frequency=3_800.0),
])
def test_the_extractors_saved_settings_give_its_features_and_token_count(tmp_path, extractor):
    """A saved extractor off its defaults, read from the file, gives transformers' features,
    mask and the processor's token count (its rule, with this extractor)."""
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    from mlx_spec.media.processor import mel_settings, read_processor

    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": saved_extractor(**extractor)}))
    settings = mel_settings(read_processor(tmp_path))
    theirs = Gemma4AudioFeatureExtractor(**extractor)
    clip = speech(1.1)
    expected = theirs([clip], return_tensors="np")
    ours = audio_features(clip, settings)
    assert np.array_equal(ours.mask, expected["input_features_mask"][0])
    assert np.array_equal(ours.features, expected["input_features"][0])
    processor = SimpleNamespace(feature_extractor=theirs, audio_seq_length=750)
    expected_tokens = Gemma4Processor._compute_audio_num_tokens(processor, clip, theirs.sampling_rate)
    assert audio_tokens(clip.size, settings) == expected_tokens


def test_a_clip_past_the_processors_audio_seq_length_is_refused(tmp_path):
    """transformers' processor writes every soft token of a clip (its cap is only on the count it
    gives vLLM): mlx-spec refuses a clip over the cap rather than cut the prompt short."""
    towers = encoder(tmp_path, {"audio_seq_length": 32})
    assert towers.audio(speech(1.2)).tokens == 30
    with pytest.raises(MediaError, match=r"makes 33 soft tokens, more than the processor's audio_seq_length 32"):
        towers.audio(speech(1.3))
