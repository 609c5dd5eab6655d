"""The vision tower of Gemma 4 E2B/E4B/26B-A4B/31B in MLX against transformers'
`Gemma4VisionModel` and `embed_vision`, on tiny random towers saved in google's layout and in
mlx-vlm's (quantized where its converter quantizes): the soft tokens' embeddings of images of
several shapes and budgets, with clipped linears and standardisation on and off, and grouped
K/V heads."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import torch
from mlx.utils import tree_flatten
from safetensors.torch import save_file

from mlx_spec.errors import MediaError
from mlx_spec.media.images import image_patches
from mlx_spec.media.towers import TowerMedia

TEXT_WIDTH = 48
SHAPES = [(40, 56), (30, 200), (100, 20)]  # (height, width)


def tower_config(clipped: bool, standardize: bool) -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=512,
                use_clipped_linears=clipped, standardize=standardize)


def random_tower(clipped: bool, standardize: bool, seed: int = 0):
    """transformers' tower and embedder with every parameter and buffer random (norm scales around
    one, clip bounds that do clip)."""
    from transformers import Gemma4TextConfig, Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel

    torch.manual_seed(seed)
    config = Gemma4VisionConfig(**tower_config(clipped, standardize))
    tower = Gemma4VisionModel(config).eval()
    embedder = Gemma4MultimodalEmbedder(config, Gemma4TextConfig(hidden_size=TEXT_WIDTH)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (tower, embedder):
            for name, p in list(module.named_parameters()) + list(module.named_buffers()):
                if name.endswith(("input_min", "output_min")):
                    p.fill_(-0.6)
                elif name.endswith(("input_max", "output_max")):
                    p.fill_(0.6)
                elif name.endswith("std_scale") or (p.ndim == 1 and "norm" in name):
                    p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=g))
                elif p.is_floating_point() and "inv_freq" not in name:
                    p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim > 1 else 0.1) / max(1, p.shape[-1]) ** 0.5
                            if p.ndim == 2 else torch.randn(p.shape, generator=g) * 0.5)
    return config, tower, embedder


def save_google(folder, config, tower, embedder):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.vision_tower.{k}": v.contiguous() for k, v in tower.state_dict().items()}
    tensors.update({f"model.embed_vision.{k}": v.contiguous() for k, v in embedder.state_dict().items()})
    save_file(tensors, str(folder / "model.safetensors"))
    return {"model_type": "gemma4", "text_config": {"hidden_size": TEXT_WIDTH}, "vision_config": config.to_dict()}


def picture(height, width, seed=0):
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


def reference(tower, embedder, patches):
    with torch.no_grad():
        hidden = tower(pixel_values=torch.tensor(patches.pixels)[None],
                       pixel_position_ids=torch.tensor(patches.positions, dtype=torch.long)[None]).last_hidden_state
        return embedder(hidden).numpy()


@pytest.mark.parametrize("clipped, standardize", [(False, False), (True, True)])
def test_the_tower_equals_transformers(tmp_path, clipped, standardize):
    config, tower, embedder = random_tower(clipped, standardize)
    media = TowerMedia(tmp_path, save_google(tmp_path, config, tower, embedder))
    worst = 0.0
    for n, shape in enumerate(SHAPES):
        for budget in (70, 140):
            item = media.image(picture(*shape, seed=n), budget)
            patches = image_patches(picture(*shape, seed=n), budget, 4, 3)
            expected = reference(tower, embedder, patches)
            ours = np.array(media.embed(item))
            assert ours.shape == expected.shape == (item.tokens, TEXT_WIDTH)
            worst = max(worst, float(np.abs(ours - expected).max()))
    assert worst <= 1e-4, worst


def test_clipping_and_standardising_change_our_output(tmp_path):
    """Our tower reads the bounds and the standardisation and applies them (not silently
    dropped): without either, the same weights give another output, which is still
    transformers' own for that checkpoint."""
    from transformers import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    config, tower, embedder = random_tower(True, True)
    pixels = picture(40, 56)
    patches = image_patches(pixels, 70, 4, 3)

    def ours(folder, config, tower):
        media = TowerMedia(folder, save_google(folder, config, tower, embedder))
        return np.array(media.embed(media.image(pixels, 70)))

    both = ours(tmp_path / "both", config, tower)
    # The standardisation off: the same weights but its own, in a config that says so.
    plain_config = Gemma4VisionConfig(**tower_config(True, False))
    plain = Gemma4VisionModel(plain_config).eval()
    missing, _ = plain.load_state_dict(tower.state_dict(), strict=False)
    assert not missing
    unstandardised = ours(tmp_path / "unstandardised", plain_config, plain)
    assert np.abs(unstandardised - both).max() > 1e-3
    assert np.abs(unstandardised - reference(plain, embedder, patches)).max() <= 1e-4
    # The bounds that no value reaches.
    with torch.no_grad():
        for name, b in tower.named_buffers():
            if name.endswith(("_min", "_max")):
                b.fill_(-np.inf if name.endswith("_min") else np.inf)
    unclipped = ours(tmp_path / "unclipped", config, tower)
    assert np.abs(unclipped - both).max() > 1e-3
    assert np.abs(unclipped - reference(tower, embedder, patches)).max() <= 1e-4


def test_the_mlx_community_layout_loads_quantized(tmp_path):
    """mlx-vlm's conversion: no `model.` prefix, the tower's projections quantized at 4 bits (as
    MLX's converter does it, on the loaded module): it loads as the module that was saved, giving
    the same embeddings bit for bit."""
    config, tower, embedder = random_tower(False, False)
    cfg = save_google(tmp_path / "google", config, tower, embedder)
    saved = TowerMedia(tmp_path / "google", cfg).towers
    nn.quantize(saved, group_size=32, bits=4, class_predicate=lambda path, m: path.endswith("proj.linear"))
    converted = tmp_path / "converted"
    converted.mkdir()
    mx.save_safetensors(str(converted / "model.safetensors"), dict(tree_flatten(saved.parameters())))
    media = TowerMedia(converted, {**cfg, "quantization": {"group_size": 32, "bits": 4}})
    item = media.image(picture(40, 56), 70)
    ours = media.embed(item)
    assert {m.bits for _, m in media.towers.named_modules() if hasattr(m, "scales")} == {4}
    pixels, positions = item.arrays
    expected = saved.embed_vision(saved.vision_tower(mx.array(pixels), mx.array(positions),
                                                          (positions[-1, 1] + 1, positions[-1, 0] + 1)))
    assert mx.array_equal(ours, expected)


def test_a_tower_missing_a_weight_is_named(tmp_path):
    config, tower, embedder = random_tower(False, False)
    cfg = save_google(tmp_path, config, tower, embedder)
    tensors = mx.load(str(tmp_path / "model.safetensors"))
    del tensors["model.vision_tower.encoder.layers.1.mlp.up_proj.linear.weight"]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), tensors)
    with pytest.raises(MediaError, match="encoder.layers.1.mlp.up_proj.linear.weight"):
        TowerMedia(tmp_path, cfg).load()
