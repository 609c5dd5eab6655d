"""The 12B's encoder-free media embedders in MLX give transformers' own image and audio
embeddings (`Gemma4UnifiedModel.get_image_features` / `get_audio_features`) on tiny
checkpoints in google's layout and in mlx-vlm's (the same names without `model.`, quantized)."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from mlx_spec.errors import MediaError
from mlx_spec.media.unified import load_unified_embedders

TOL = 1e-4  # float32


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    folder = tiny.build_target(tmp_path_factory.mktemp("unified") / "google", layout="google", variant="12b",
                               tokenizer=False)
    return folder, json.loads((folder / "config.json").read_text())


def image_inputs(config, patches=11, padding=5, seed=0):
    """Random merged patches in [0, 1] with grid positions, then padding patches at (-1, -1)."""
    vision = config["vision_config"]
    side = vision["patch_size"] * vision["pooling_kernel_size"]
    rng = np.random.default_rng(seed)
    pixels = rng.random((patches + padding, side * side * 3), dtype=np.float32)
    positions = np.array([(i % 4, i // 4) for i in range(patches)] + [(-1, -1)] * padding)
    return pixels, positions


def test_image_embeddings_equal_transformers(google):
    from transformers import Gemma4UnifiedForConditionalGeneration

    folder, config = google
    pixels, positions = image_inputs(config)
    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        (expected,) = model.model.get_image_features(torch.tensor(pixels)[None], torch.tensor(positions)[None]).pooler_output
    embedders = load_unified_embedders(folder, config)
    ours = np.array(embedders.image(mx.array(pixels), mx.array(positions)))
    real = (positions != -1).all(-1)
    assert expected.shape[0] == real.sum() and ours.shape[-1] == config["text_config"]["hidden_size"]
    assert np.abs(ours[real] - expected.numpy()).max() <= TOL


def test_audio_embeddings_equal_transformers(google):
    from transformers import Gemma4UnifiedForConditionalGeneration

    folder, config = google
    width = config["audio_config"]["audio_embed_dim"]
    frames = np.random.default_rng(1).uniform(-1, 1, (1, 9, width)).astype(np.float32)
    mask = np.ones((1, 9), dtype=bool)
    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model.model.get_audio_features(torch.tensor(frames), torch.tensor(mask)).pooler_output
    ours = np.array(load_unified_embedders(folder, config).audio(mx.array(frames[0])))
    assert np.abs(ours - expected.numpy()[0]).max() <= TOL


def test_the_mlx_vlm_layout_quantized_loads_as_saved(google, tmp_path):
    """mlx-vlm's names (no `model.`), its projections quantized at 4 bits: they load quantized and
    compute what the same quantized modules compute."""
    import mlx.nn as nn

    folder, config = google
    embedders = load_unified_embedders(folder, config)
    nn.quantize(embedders, group_size=64, bits=4,
                class_predicate=lambda path, m: isinstance(m, nn.Linear) and path.endswith(("projection", "patch_dense")))
    converted = tmp_path / "converted"
    shutil.copytree(folder, converted, ignore=shutil.ignore_patterns("*.safetensors"))
    from mlx.utils import tree_flatten

    mx.save_safetensors(str(converted / "model.safetensors"), dict(tree_flatten(embedders.parameters())))
    (converted / "config.json").write_text(json.dumps(dict(config, quantization={"group_size": 64, "bits": 4})))
    loaded = load_unified_embedders(converted, dict(config, quantization={"group_size": 64, "bits": 4}))
    assert isinstance(loaded.embed_audio.embedding_projection, nn.QuantizedLinear)
    assert isinstance(loaded.vision_embedder.patch_dense, nn.QuantizedLinear)
    assert isinstance(loaded.vision_embedder.patch_ln1, nn.LayerNorm)
    pixels, positions = image_inputs(config, seed=2)
    args = (mx.array(pixels), mx.array(positions))
    assert mx.array_equal(loaded.image(*args), embedders.image(*args))


def test_a_checkpoint_without_embedders_says_so(checkpoints):
    with pytest.raises(MediaError, match=r"no media encoder weights \(a text-only checkpoint\)"):
        load_unified_embedders(checkpoints["text"], {"text_config": {"hidden_size": 64}})
