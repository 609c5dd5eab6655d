"""Every quantization mode MLX writes (affine 4 and 8 bits, mxfp4, mxfp8, nvfp4, and per-layer
bits as mlx-vlm's mixed_4_8 writes them), for targets in the mlx-community layout and for
drafters: they load in their own mode, and MTP on gives exactly the tokens of MTP off."""

import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import tiny
from mlx_spec import LoadError, load
from mlx_spec.models import load_drafter, load_target
from kv import fresh_cache

MODES = {
    "affine-4": {"mode": "affine", "bits": 4, "group_size": 64},
    "affine-8": {"mode": "affine", "bits": 8, "group_size": 64},
    "mxfp4": {"mode": "mxfp4", "bits": 4, "group_size": 32},
    "mxfp8": {"mode": "mxfp8", "bits": 8, "group_size": 32},
    "nvfp4": {"mode": "nvfp4", "bits": 4, "group_size": 16},
    # mlx-vlm's --quant-predicate mixed_4_8: 8-bit embeddings, 4-bit elsewhere, written per layer.
    "mixed-4-8": {"mode": "affine", "bits": 4, "group_size": 64, "eight_bit": "embed_tokens"},
}


def quantize_and_save(module: nn.Module, source, folder, spec: dict, rename=lambda k: k, extra=None):
    """Quantize `module` as MLX's converters do (layers whose input width fits the group size),
    save its weights under the converter's key names, and write the quantization config."""
    spec = dict(spec)
    eight_bit = spec.pop("eight_bit", None)
    overrides = {}

    def predicate(path, m):
        if not hasattr(m, "to_quantized") or m.weight.shape[-1] % spec["group_size"] != 0:
            return False
        if eight_bit and path.endswith(eight_bit):
            overrides[rename(path)] = {"group_size": spec["group_size"], "bits": 8, "mode": "affine"}
            return overrides[rename(path)]
        return True

    nn.quantize(module, group_size=spec["group_size"], bits=spec["bits"], mode=spec["mode"], class_predicate=predicate)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    weights = {rename(k): v for k, v in tree_flatten(module.parameters())}
    weights.update(extra or {})
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = {**spec, **overrides}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    """Target (mlx-community layout: `language_model.model.*`, the towers kept unquantized)
    and drafter, in every mode."""
    root = tmp_path_factory.mktemp("quantized")
    towers = {k.removeprefix("model."): v for k, v in mx.load(str(checkpoints["google"] / "model.safetensors")).items()
              if "language_model" not in k}
    out = {}
    for name, spec in MODES.items():
        target, _ = load_target(str(checkpoints["google"]))
        source = root / f"source-{name}"
        shutil.copytree(checkpoints["google"], source)
        for file in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(checkpoints["text"] / file, source / file)
        assistant, _ = load_drafter(str(checkpoints["assistant"]))
        out[name] = (
            quantize_and_save(target.model, source, root / f"target-{name}", spec, extra=towers),
            quantize_and_save(assistant, checkpoints["assistant"], root / f"drafter-{name}", spec),
        )
    return out


def quantized_modes(module: nn.Module) -> set:
    return {(m.mode, m.bits) for _, m in module.named_modules() if hasattr(m, "scales")}


@pytest.mark.parametrize("name", MODES)
def test_every_mode_loads_and_mtp_on_equals_off(converted, name):
    target_folder, drafter_folder = converted[name]
    loaded = load(str(target_folder), str(drafter_folder))
    spec = MODES[name]
    expected = {(spec["mode"], spec["bits"])} | ({("affine", 8)} if "eight_bit" in spec else set())
    assert quantized_modes(loaded.assistant) == expected
    assert quantized_modes(loaded.target.model) == expected
    if "eight_bit" in spec:
        assert loaded.assistant.model.embed_tokens.bits == 8 and loaded.assistant.pre_projection.bits == 4
    engine = loaded.with_stop_tokens([])
    prompt = np.random.RandomState(5).randint(0, tiny.VOCAB, size=2 * tiny.WINDOW).tolist()
    off = engine.generate(prompt, max_tokens=4 * tiny.WINDOW, mtp=False)
    on = engine.generate(prompt, max_tokens=4 * tiny.WINDOW, draft_tokens=4, lookup=False)
    assert on.tokens == off.tokens
    assert on.stats.drafted > 0


@pytest.mark.parametrize("mode, bits", [("mxfp4", None), ("mxfp8", None), ("nvfp4", None), ("affine", 4)])
def test_quantizing_the_drafter_at_load_in_each_mode(checkpoints, mode, bits):
    loaded = load(str(checkpoints["text"]), str(checkpoints["assistant"]), drafter_bits=bits, drafter_mode=mode)
    assert {m for m, _ in quantized_modes(loaded.assistant)} == {mode}
    engine = loaded.with_stop_tokens([])
    prompt = list(range(5, 5 + 2 * tiny.WINDOW))
    off = engine.generate(prompt, max_tokens=3 * tiny.WINDOW, mtp=False)
    assert engine.generate(prompt, max_tokens=3 * tiny.WINDOW, draft_tokens=3, lookup=False).tokens == off.tokens


@pytest.mark.parametrize(
    "bits, mode, message",
    [
        (3, None, "must be 4 or 8 bits, got 3"),
        (None, "affine", r"affine drafter quantization must be 4 or 8 bits, got none \(give --drafter-bits, or drafter_bits\)"),
        (8, "mxfp4", "mode mxfp4 is 4-bit, got 8 bits"),
        (None, "int3", "mode must be one of affine, mxfp4, mxfp8, nvfp4, got 'int3'"),
    ],
)
def test_impossible_drafter_quantization(checkpoints, bits, mode, message):
    with pytest.raises(LoadError, match=message):
        load_drafter(str(checkpoints["assistant"]), bits, mode)


def test_a_quantized_drafter_is_not_quantized_again(converted):
    with pytest.raises(LoadError, match="already quantized; cannot quantize it again"):
        load_drafter(str(converted["mxfp4"][1]), None, "nvfp4")


def test_the_12b_in_the_mlx_community_layout(family, tmp_path):
    """The 12B as mlx-vlm's converter writes it: `language_model.model.*` at 4 bits (keys equal to
    values: no v_proj on full layers), and the encoder-free media embedders beside it under
    mlx-vlm's names (`vision_embedder.*`, `embed_vision.*`, `embed_audio.*`), the projections
    quantized as the published 0.6-era conversions have them. It loads as the model that was
    saved (the same logits, bit for bit) with the 12B's assistant, and MTP on equals MTP off."""
    google = tiny.build_target(tmp_path / "google", layout="google", variant="12b")
    media = {}
    for key, value in mx.load(str(google / "model.safetensors")).items():
        if "language_model" in key:
            continue
        key = key.removeprefix("model.")
        if key.endswith("_projection.weight") or key.endswith("patch_dense.weight"):
            weight, scales, biases = mx.quantize(value, group_size=64, bits=4)
            base = key.removesuffix(".weight")
            media.update({key: weight, f"{base}.scales": scales, f"{base}.biases": biases})
        else:
            media[key] = value
    assert {k.split(".")[0] for k in media} == {"vision_embedder", "embed_vision", "embed_audio"}
    target, _ = load_target(str(google))
    folder = quantize_and_save(target.model, google, tmp_path / "converted", MODES["affine-4"], extra=media)
    on_disk = mx.load(str(folder / "model.safetensors"))
    assert any(k.startswith("language_model.model.layers.0.self_attn.v_proj") for k in on_disk)
    assert not any(k.startswith("language_model.model.layers.5.self_attn.v_proj") for k in on_disk)

    loaded = load(str(folder), str(family("12b")["assistant"]))
    assert quantized_modes(loaded.target.model) == {("affine", 4)}
    ids = mx.array(np.random.RandomState(6).randint(0, tiny.VOCAB, size=(1, 2 * tiny.WINDOW)))
    assert mx.array_equal(loaded.target(ids, fresh_cache(loaded.target))[0], target(ids, fresh_cache(target))[0])
    engine = loaded.with_stop_tokens([])
    prompt = ids[0].tolist()
    off = engine.generate(prompt, max_tokens=3 * tiny.WINDOW, mtp=False)
    on = engine.generate(prompt, max_tokens=3 * tiny.WINDOW, draft_tokens=4, lookup=False)
    assert on.tokens == off.tokens and on.stats.drafted > 0
