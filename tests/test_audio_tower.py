"""The MLX audio tower equals transformers' `Gemma4AudioModel` + `Gemma4MultimodalEmbedder` on
tiny random configs (clipped linears on and off, chunk geometries with several blocks), on clips
whose features come from `audio_features`, keeping the valid soft tokens as `Gemma4Model` does;
the token count is `audio_tokens`'; a checkpoint's files in google's layout and in mlx-vlm's
(quantized) load to the same tokens; a checkpoint that lacks or misshapes a weight is refused."""

import functools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_spec.errors import LoadError
from mlx_spec.media.audio import SAMPLE_RATE, audio_features, audio_tokens
from mlx_spec.media.audio_tower import AudioTower, audio_tower_weights, soft_tokens
from mlx_spec.errors import AudioWeightsError
from mlx_spec.media.towers import TowerMedia

torch = pytest.importorskip("torch", reason="torch (transformers, the oracle) is not installed: pip install torch")

TEXT_HIDDEN = 24
BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, subsampling_conv_channels=[128, 8],
            conv_kernel_size=3, output_proj_dims=40, rms_norm_eps=1e-2)
CONFIGS = {
    # chunk 4 with 5 past keys: context 9, so context // 2 != past and the shift's wrap matters
    "clipped": dict(BASE, use_clipped_linears=True, attention_chunk_size=4, attention_context_left=6,
                    attention_context_right=0),
    # no clipping, and a future horizon: keys after the query are in the window too
    "unclipped": dict(BASE, use_clipped_linears=False, attention_chunk_size=5, attention_context_left=4,
                      attention_context_right=3, attention_logit_cap=3.0),
}
# 0.3 s and 2.7 s end inside the last 128-sample pad (the mask has a padded frame); 1 s and
# 12345 samples have none; 8449 samples give a padded soft token the tower must drop; at 4225
# the last valid token's second convolution reaches a padded first-convolution output, which
# transformers zeroes.
SAMPLE_COUNTS = [int(0.3 * SAMPLE_RATE), SAMPLE_RATE, 12345, 8449, 4225, int(2.7 * SAMPLE_RATE)]


def clip(count: int, seed: int = 0) -> np.ndarray:
    """Speech-like audio: a few drifting tones and noise."""
    rng = np.random.default_rng(seed + count)
    t = np.arange(count) / SAMPLE_RATE
    tones = sum(np.sin(2 * np.pi * f * t * (1 + 0.1 * t)) / (i + 1) for i, f in enumerate((180, 420, 1300)))
    return (0.3 * tones + 0.05 * rng.standard_normal(count)).astype(np.float32)


def randomise(module, seed: int) -> None:
    """Every parameter and clip bound non-trivial: norms around 1, scales and biases nonzero,
    clip bounds finite and tight enough that some values are clipped."""
    generator = torch.Generator().manual_seed(seed)

    def normal(shape):
        return torch.randn(shape, generator=generator)

    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * normal(p.shape))
            elif p.ndim == 1:  # per_dim_scale, output_proj.bias
                p.copy_(0.5 * normal(p.shape))
            else:
                p.copy_(normal(p.shape) / np.sqrt(np.prod(p.shape[1:])))
        for name, b in module.named_buffers():
            if name.endswith(("_min", "_max")):
                sign = -1 if name.endswith("_min") else 1
                b.copy_(sign * (0.6 + torch.rand((), generator=generator)))


@functools.lru_cache(maxsize=None)
def oracle(name: str):
    """transformers' tower and embedder for config `name`, and their weights under google's keys."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig, Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioModel, Gemma4MultimodalEmbedder

    audio_config = Gemma4AudioConfig(**CONFIGS[name])
    tower = Gemma4AudioModel(audio_config).float().eval()
    embedder = Gemma4MultimodalEmbedder(audio_config, Gemma4TextConfig(hidden_size=TEXT_HIDDEN)).float().eval()
    randomise(tower, seed=1)
    randomise(embedder, seed=2)
    weights = {f"model.audio_tower.{k}": v.numpy() for k, v in tower.state_dict().items()}
    weights.update({f"model.embed_audio.{k}": v.numpy() for k, v in embedder.state_dict().items()})
    return tower, embedder, weights


def expected_tokens(name: str, features) -> np.ndarray:
    """One clip through transformers as `Gemma4Model` puts it: tower, embedder, valid tokens."""
    tower, embedder, _ = oracle(name)
    with torch.no_grad():
        out = tower(torch.from_numpy(features.features[None]), torch.from_numpy(features.mask[None]))
        return embedder(out.last_hidden_state)[out.attention_mask].numpy()


def mlx_tower(name: str, weights=None) -> AudioTower:
    tower = AudioTower(CONFIGS[name], TEXT_HIDDEN)
    tower.load_checkpoint(oracle(name)[2] if weights is None else weights)
    return tower


@pytest.mark.parametrize("name", CONFIGS)
def test_tower_equals_transformers(name):
    tower = mlx_tower(name)
    for count in SAMPLE_COUNTS:
        features = audio_features(clip(count))
        expected = expected_tokens(name, features)
        ours = np.array(tower(mx.array(features.features), mx.array(features.mask)))
        assert ours.shape == expected.shape == (audio_tokens(count), TEXT_HIDDEN), count
        assert np.abs(ours - expected).max() <= 1e-4, (name, count, np.abs(ours - expected).max())


def test_padded_tokens_are_dropped():
    features = audio_features(clip(8449))
    assert -(-len(features.mask) // 4) == audio_tokens(8449) + 1  # the case has a padded token
    assert mlx_tower("clipped")(mx.array(features.features), mx.array(features.mask)).shape[0] == audio_tokens(8449)


def test_clip_bounds_are_loaded_and_used():
    """With the checkpoint's bounds set to infinity the output moves far from transformers'."""
    loose = {k: (np.float32(np.sign(v) * np.inf) if k.endswith(("_min", "_max")) else v)
             for k, v in oracle("clipped")[2].items()}
    features = audio_features(clip(SAMPLE_RATE))
    ours = np.array(mlx_tower("clipped", loose)(mx.array(features.features), mx.array(features.mask)))
    assert np.abs(ours - expected_tokens("clipped", features)).max() > 1e-2


def test_parameter_names_are_the_checkpoints():
    weights = oracle("clipped")[2]
    names = set(dict(tree_flatten(AudioTower(CONFIGS["clipped"], TEXT_HIDDEN).parameters())))
    assert set(audio_tower_weights(weights)) == names
    assert "tower.layers.1.self_attn.q_proj.input_max" in names
    assert audio_tower_weights(weights)["tower.subsample_conv_projection.layer0.conv.weight"].shape == (128, 3, 3, 1)
    assert not any("_min" in n or "_max" in n for n in dict(tree_flatten(
        AudioTower(CONFIGS["unclipped"], TEXT_HIDDEN).parameters())))


def test_missing_or_misshapen_weights_are_named():
    weights = dict(oracle("clipped")[2], **{"model.language_model.other": np.zeros(3)})
    missing = {k: v for k, v in weights.items() if k != "model.audio_tower.layers.1.self_attn.k_proj.input_max"}
    with pytest.raises(AudioWeightsError, match=r"lacks model\.audio_tower\.layers\.1\.self_attn\.k_proj\.input_max"):
        mlx_tower("clipped", missing)
    assert issubclass(AudioWeightsError, LoadError)
    transposed = dict(weights, **{"model.audio_tower.output_proj.weight": weights["model.audio_tower.output_proj.weight"].T})
    with pytest.raises(LoadError, match=r"model\.audio_tower\.output_proj\.weight \(32, 40\) \(expected \(40, 32\)\)"):
        mlx_tower("clipped", transposed)
    with pytest.raises(LoadError, match="does not use: model.audio_tower.layers.0.feed_forward1.ffw_layer_1.input_max"):
        mlx_tower("unclipped", oracle("clipped")[2])


def save_google(folder, name):
    """The tower and embedder of config `name` as google's checkpoint files hold them."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in oracle(name)[2].items()}, str(folder / "model.safetensors"))
    return {"model_type": "gemma4", "text_config": {"hidden_size": TEXT_HIDDEN}, "audio_config": CONFIGS[name]}


@pytest.mark.parametrize("name", CONFIGS)
def test_a_checkpoint_s_files_give_transformers_tokens(tmp_path, name):
    """What a prompt runs: the encoder of a google-layout checkpoint (`TowerMedia`, reading the
    safetensors lazily), from the clip's samples to its soft tokens."""
    media = TowerMedia(tmp_path, save_google(tmp_path, name))
    samples = clip(SAMPLE_RATE)
    item = media.audio(samples)
    assert item.tokens == audio_tokens(SAMPLE_RATE)
    expected = expected_tokens(name, audio_features(samples))
    assert np.abs(np.array(media.embed(item)) - expected).max() <= 1e-4


def test_the_mlx_community_layout_loads_quantized(tmp_path):
    """mlx-vlm's conversion: no `model.` prefix, convolution kernels already in MLX's layout, the
    conformer's projections quantized at 4 bits: it loads as the module that was saved, giving
    the same tokens bit for bit."""
    config = save_google(tmp_path / "google", "clipped")
    saved = TowerMedia(tmp_path / "google", config).towers
    nn.quantize(saved, group_size=32, bits=4, class_predicate=lambda path, m: path.endswith(".linear"))
    converted = tmp_path / "converted"
    converted.mkdir()
    mx.save_safetensors(str(converted / "model.safetensors"), dict(tree_flatten(saved.parameters())))
    media = TowerMedia(converted, {**config, "quantization": {"group_size": 32, "bits": 4}})
    item = media.audio(clip(SAMPLE_RATE))
    ours = media.embed(item)
    assert {m.bits for _, m in media.towers.named_modules() if hasattr(m, "scales")} == {4}
    features, mask = item.arrays
    assert mx.array_equal(ours, soft_tokens(saved.audio_tower, saved.embed_audio, features, mask))
