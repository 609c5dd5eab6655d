"""Qwen3.5's target and MTP layer, loaded by mlx-spec, against transformers (issue: Qwen).

Tiny random checkpoints (tests/tiny_qwen.py) in both layouts Qwen publishes (the text model
alone and the multimodal wrapper), dense and mixture of experts. The target's logits must be
transformers' own, whole and position by position through its caches; the MTP layer's those of a
reference built from transformers' own decoder layer and norms, with every norm weight random, so
that a (1 + w) shift missing or applied twice shows."""

import json

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny_qwen

from mlx_spec.errors import LoadError
from mlx_spec.models.checkpoint import read_checkpoint
from mlx_spec.models.qwen3_5.loader import mtp_from, target_from

PROMPT = [5, 17, 99, 3, 250, 41, 7, 7, 8, 300, 12, 64, 64, 2, 11, 19, 120, 45, 46, 47, 3, 9, 81, 200]


@pytest.fixture(scope="module", params=["dense", "moe"])
def checkpoints(request, tmp_path_factory):
    """(the text layout's folder, the multimodal layout's, moe) of one tiny model."""
    moe = request.param == "moe"
    text = tiny_qwen.build(tmp_path_factory.mktemp(f"{request.param}-text"), moe=moe)
    multimodal = tiny_qwen.build(tmp_path_factory.mktemp(f"{request.param}-multimodal"), moe=moe, layout="multimodal")
    return text, multimodal, moe


@pytest.fixture(scope="module")
def reference(checkpoints):
    """transformers' logits and final hidden states over PROMPT, its input embeddings, and its MTP
    layer's logits for positions 0 .. n-2 (token t+1 beside the hidden state at t)."""
    text, _, moe = checkpoints
    model, head = tiny_qwen.reference(text, moe=moe)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # after the final norm
        embeddings = model.model.embed_tokens(ids)
        drafted = model.lm_head(head(embeddings[:, 1:], hidden[:, :-1], torch.arange(len(PROMPT) - 1)))
    return out.logits[0].numpy(), drafted[0].numpy()


def loaded(folder):
    ckpt = read_checkpoint(folder, "target")
    model = target_from(ckpt)
    mx.eval(model.parameters())
    return ckpt, model


def test_the_target_s_logits_are_transformers(checkpoints, reference):
    logits, _ = reference
    for folder in checkpoints[:2]:
        _, model = loaded(folder)
        ours = model(mx.array([PROMPT]))[0]
        np.testing.assert_allclose(np.array(ours), logits, atol=2e-4, rtol=1e-4, err_msg=str(folder))
        # Through the caches: a prefill, then a position at a time (the recurrent state and the
        # convolution's window carried by the Gated DeltaNet layers' caches).
        cache = model.language_model.make_cache()
        steps = [model(mx.array([PROMPT[:10]]), cache=cache)[0]]
        steps += [model(mx.array([[token]]), cache=cache)[0] for token in PROMPT[10:]]
        np.testing.assert_allclose(np.array(mx.concatenate(steps)), logits, atol=2e-4, rtol=1e-4)


def test_the_mtp_layer_drafts_as_the_reference(checkpoints, reference):
    _, drafted = reference
    for folder in checkpoints[:2]:
        ckpt, model = loaded(folder)
        layer = mtp_from(ckpt, model.language_model.args)
        lm = model.language_model
        ids = mx.array([PROMPT])
        hidden = lm.model(ids)  # after the final norm
        embeddings = lm.model.embed_tokens(ids)
        ours = lm.lm_head(layer(embeddings[:, 1:], hidden[:, :-1]))[0]
        np.testing.assert_allclose(np.array(ours), drafted, atol=2e-4, rtol=1e-4, err_msg=str(folder))
        # With its own K/V: the prompt's pairs first, then one position at a time.
        from mlx_lm.models.cache import KVCache

        cache = KVCache()
        parts = [layer(embeddings[:, 1:9], hidden[:, :8], cache)]
        parts += [layer(embeddings[:, t + 1 : t + 2], hidden[:, t : t + 1], cache) for t in range(8, len(PROMPT) - 1)]
        np.testing.assert_allclose(np.array(lm.lm_head(mx.concatenate(parts, axis=1))[0]), drafted, atol=2e-4, rtol=1e-4)


def test_a_norm_shifted_twice_or_not_at_all_shows(checkpoints, reference):
    """The test above can fail: the MTP layer's norms left unshifted, or shifted again, part
    from the reference."""
    from mlx_spec.models.checkpoint import weight_files
    from mlx_spec.models.qwen3_5.mtp import SHIFTED_NORMS, MTPLayer, sanitize

    _, drafted = reference
    ckpt, model = loaded(checkpoints[0])
    lm = model.language_model
    ids = mx.array([PROMPT])
    hidden, embeddings = lm.model(ids), lm.model.embed_tokens(ids)
    raw = {k: v for f in weight_files(ckpt.path) for k, v in mx.load(f).items() if k.startswith("mtp.")}
    once = sanitize(raw)
    unshifted = {k: v - 1.0 if v.ndim == 1 and (k == "norm.weight" or k.endswith(SHIFTED_NORMS)) else v
                 for k, v in once.items()}
    twice = {k: v + 1.0 if v.ndim == 1 else v for k, v in once.items()}
    for weights in (unshifted, twice):
        layer = MTPLayer(lm.args)
        layer.load_weights(list(weights.items()), strict=True)
        ours = np.array(lm.lm_head(layer(embeddings[:, 1:], hidden[:, :-1]))[0])
        assert np.abs(ours - drafted).max() > 1e-2


def test_a_checkpoint_without_its_mtp_layer_says_so(tmp_path):
    folder = tiny_qwen.build(tmp_path / "none", mtp=False)
    ckpt, model = loaded(folder)
    with pytest.raises(LoadError, match="mtp_num_hidden_layers 0"):
        mtp_from(ckpt, model.language_model.args)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    ckpt, model = loaded(folder)
    with pytest.raises(LoadError, match="no weight is under mtp"):
        mtp_from(ckpt, model.language_model.args)


def test_a_conversion_that_dropped_the_mtp_layer_loads_drafting_by_lookup(tmp_path):
    """mlx-lm's conversions drop mtp.* but keep the config's count: drafter "auto" then loads the
    target alone, with a warning saying why, where an explicit drafter is a LoadError."""
    import mlx_spec

    folder = tiny_qwen.save_tokenizer(tiny_qwen.build(tmp_path / "dropped", mtp=False))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    with pytest.warns(UserWarning, match="drafts by prompt lookup alone"):
        engine = mlx_spec.load(str(folder))
    assert engine.pair.assistant is None and engine.pair.target.mtp is None
    with pytest.raises(LoadError, match="no weight is under mtp"):
        mlx_spec.load(str(folder), drafter=str(folder))


@pytest.mark.parametrize("stored", ["shifted", "raw"])
def test_an_mlx_conversion_with_the_mtp_layer_added_loads_it_quantized_and_shifted_once(tmp_path, stored):
    """mlx-lm's conversion (8-bit) of the tiny checkpoint, the MTP layer then added quantized as
    the target is, its norms stored shifted (as mlx-lm shifts the target's) or raw (as scripts
    that copy Qwen's mtp.* tensors leave them): either way the loaded layer is the one quantized
    here from the shifted weights, bit for bit."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm import convert

    from mlx_spec.models.qwen3_5.mtp import SHIFTED_NORMS

    folder = tiny_qwen.build(tmp_path / "hf", layout="multimodal")  # (the model_type mlx-lm converts)
    converted = tmp_path / "mlx"
    convert(str(folder), str(converted), quantize=True, q_bits=8, q_group_size=32)
    ckpt, model = loaded(folder)
    layer = mtp_from(ckpt, model.language_model.args)
    nn.quantize(layer, group_size=32, bits=8)
    stored_weights = {}
    for name, value in tree_flatten(layer.parameters()):
        norm = value.ndim == 1 and (name == "norm.weight" or name.endswith(SHIFTED_NORMS))
        stored_weights[f"mtp.{name}"] = value - 1.0 if norm and stored == "raw" else value
    mx.save_safetensors(str(converted / "model-mtp.safetensors"), stored_weights)
    config = json.loads((converted / "config.json").read_text())
    assert config["quantization"]["bits"] == 8 and mtp_layers_said(config) == 1
    ours, their_model = loaded(converted)
    reloaded = mtp_from(ours, their_model.language_model.args)
    ids = mx.array([PROMPT])
    hidden, embeddings = model.language_model.model(ids), model.language_model.model.embed_tokens(ids)
    assert mx.array_equal(reloaded(embeddings[:, 1:], hidden[:, :-1]), layer(embeddings[:, 1:], hidden[:, :-1]))


def mtp_layers_said(config: dict) -> int:
    text = config.get("text_config", config)
    return text.get("mtp_num_hidden_layers", 0)


def test_a_split_mtp_folder_is_the_same_drafter(checkpoints, tmp_path):
    """The MTP layer split into a `qwen3_5_mtp` folder of its own (mlx-vlm's layout) loads as
    the drafter, to the same weights as from the target's own checkpoint, and decodes exactly;
    passed as the target, it says what it is."""
    import mlx_spec
    from mlx.utils import tree_flatten

    from mlx_spec.models.qwen3_5.loader import drafter_from

    text, _, moe = checkpoints
    split = tiny_qwen.split_mtp(text, tmp_path / "mtp")
    own = dict(tree_flatten(drafter_from(read_checkpoint(text, "drafter")).parameters()))
    separate = dict(tree_flatten(drafter_from(read_checkpoint(split, "drafter")).parameters()))
    assert own.keys() == separate.keys()
    assert all(mx.array_equal(own[k], separate[k]) for k in own)
    engine = mlx_spec.load(str(text), drafter=str(split)).with_stop_tokens([])
    assert engine.pair.drafter_path == split and engine.pair.target.mtp is engine.pair.assistant.layer
    model, _ = tiny_qwen.reference(text, moe=moe)
    with torch.no_grad():
        expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(PROMPT):].tolist()
    assert engine.generate(PROMPT, max_tokens=24, draft_tokens=3).tokens == expected
    with pytest.raises(LoadError, match="this is an MTP drafter"):
        mlx_spec.load(str(split))


def test_sizes_by_name_are_the_4bit_targets_with_their_split_mtp_layers():
    from mlx_spec.loading import resolve_names
    from mlx_spec.models import FAMILIES

    for name, size in (("qwen3.6-27b", "Qwen3.6-27B"), ("Qwen3.6-35B-A3B", "Qwen3.6-35B-A3B"), ("qwen3.5-9b", "Qwen3.5-9B"),
                       ("qwen3.5-4b", "Qwen3.5-4B")):
        expected = (f"mlx-community/{size}-4bit", f"mlx-community/{size}-MTP-bf16")
        assert resolve_names(name, "auto") == expected  # by name, any case
        assert resolve_names(expected[0], "auto") == expected  # and by the target's id
        assert resolve_names(name, None) == (expected[0], None)
    assert "qwen3.6-27b" in FAMILIES.size_names and "e2b" in FAMILIES.size_names


def test_a_bench_names_the_drafter_auto_finds_in_a_folder(checkpoints):
    """`mlx-spec bench --model FOLDER` with drafter auto: its header names the drafter the
    family finds there (Qwen's: the target's own folder) and its files, not "auto"."""
    from types import SimpleNamespace

    from mlx_spec.bench.models import describe_models

    text = checkpoints[0]
    described = describe_models(SimpleNamespace(random_weights=False, model=str(text), drafter="auto", shape=None))
    assert described["drafter"] == str(text)
    assert [e["file"] for e in described["files"]["drafter"]] == ["model.safetensors", "config.json"]
