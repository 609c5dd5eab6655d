"""Loading: hub ids and folders, both target layouts, quantized drafters, and clear errors."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import tiny
from mlx_spec import LoadError, load
from mlx_spec.models import load_drafter, load_target
from mlx_spec.models.checkpoint import resolve
from kv import exact_kv, fresh_cache, prefill, step_kv


def copy_of(folder, tmp_path, name="copy"):
    dest = tmp_path / name
    shutil.copytree(folder, dest)
    return dest


def rewrite_weights(folder, change):
    file = folder / "model.safetensors"
    weights = dict(mx.load(str(file)))
    change(weights)
    mx.save_safetensors(str(file), weights, metadata={"format": "pt"})


def test_load_returns_engine_with_tokenizer(checkpoints):
    engine = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    assert engine.assistant is not None
    assert engine.tokenizer is not None
    assert engine.tokenizer.encode("Hello!")
    assert engine.target.vocab_size == tiny.VOCAB


def test_folder_without_tokenizer_loads_with_none(checkpoints):
    engine = load(str(checkpoints["google"]), drafter=None)
    assert engine.tokenizer is None and engine.assistant is None


def test_missing_folder(tmp_path):
    with pytest.raises(LoadError, match=r"target .*nowhere: no such folder"):
        load(str(tmp_path / "nowhere"), drafter=None)


def test_mistyped_folder_that_looks_like_a_hub_id(monkeypatch):
    """`mlx/assistant-x` (one slash, no such folder) is tried as a hub id; offline, the error
    says both: no such folder, and no such repo in the local cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError, match=r"drafter mlx/assistant-x: no such folder; as a hub repo it is not in the local cache"):
        resolve("mlx/assistant-x", "drafter")


def test_a_hub_id_with_the_hub_unreachable_fails_at_once(tmp_path):
    """Not cached and no hub (here an endpoint nobody listens on, as on a plane): the command
    said so after 25 s of huggingface_hub's retries of the config's download for the memory
    check, five "Retrying in 8s" lines among them (found by a review). The check needs the
    weights' sizes too, and their lookup failed at once: it now stops there."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-m", "mlx_spec", "generate", "--model", "someorg/not-here", "-p", "hi"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Retrying" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "mlx-spec: target someorg/not-here: no such folder; as a hub repo it is not in the local cache either, "
        "and the hub cannot be reached (offline?)"), done.stderr


def test_hub_repo_that_does_not_exist(monkeypatch):
    from unittest.mock import Mock

    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def not_found(repo_id, **kwargs):
        raise RepositoryNotFoundError(f"404 {repo_id}", response=Mock(status_code=404, headers={}))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_found)
    with pytest.raises(LoadError, match=r"drafter someone/missing: no such folder, and no such repository"):
        resolve("someone/missing", "drafter")


def test_hub_download_asks_only_for_needed_files(monkeypatch, checkpoints):
    import huggingface_hub

    asked = {}

    def fake_download(repo_id, allow_patterns=None, **kwargs):
        asked.update(repo=repo_id, patterns=allow_patterns)
        return str(checkpoints["text"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    target, ckpt = load_target("mlx-community/gemma-4-e2b-it-4bit")
    assert asked["repo"] == "mlx-community/gemma-4-e2b-it-4bit"
    assert "*.safetensors" in asked["patterns"]
    assert not any(p.endswith((".bin", ".py", ".pt", ".pth")) for p in asked["patterns"])
    assert ckpt.path == checkpoints["text"]


def test_no_config(checkpoints, tmp_path):
    folder = copy_of(checkpoints["text"], tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(LoadError, match=r"target .*copy: no config.json"):
        load_target(str(folder))


def test_no_weights_and_pickles_are_not_read(checkpoints, tmp_path):
    folder = copy_of(checkpoints["text"], tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(LoadError, match=r"target .*copy: no weights \(model\*.safetensors\)"):
        load_target(str(folder))


def test_missing_tensor(checkpoints, tmp_path):
    folder = copy_of(checkpoints["text"], tmp_path)
    rewrite_weights(folder, lambda w: w.pop("model.layers.2.mlp.up_proj.weight"))
    with pytest.raises(LoadError, match=r"target .*copy: the weights do not fit the config: .*layers.2.mlp.up_proj"):
        load_target(str(folder))


def test_wrong_shape(checkpoints, tmp_path):
    folder = copy_of(checkpoints["assistant"], tmp_path)

    def shrink(w):
        w["pre_projection.weight"] = w["pre_projection.weight"][:, :10]

    rewrite_weights(folder, shrink)
    with pytest.raises(LoadError, match=r"drafter .*copy: the weights do not fit the config: .*pre_projection"):
        load_drafter(str(folder))


def test_drafter_given_as_target_and_the_reverse(checkpoints):
    with pytest.raises(LoadError, match=r"this is an MTP drafter \(gemma4_assistant\); pass it as the drafter"):
        load(str(checkpoints["assistant"]), drafter=None)
    with pytest.raises(LoadError, match=r"this is a Gemma 4 target \(gemma4_text\); pass it as the target"):
        load(str(checkpoints["text"]), drafter=str(checkpoints["text"]))


def test_unknown_model_type(checkpoints, tmp_path):
    folder = copy_of(checkpoints["text"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"model_type 'llama' is not one of gemma4"):
        load_target(str(folder))


def test_drafter_for_another_backbone(checkpoints, tmp_path):
    folder = tiny.build_assistant(tmp_path / "wide", backbone=2 * tiny.HIDDEN)
    with pytest.raises(LoadError, match=r"does not match the target: backbone_hidden_size 128 != target hidden_size 64"):
        load(str(checkpoints["text"]), drafter=str(folder))


def test_drafter_with_another_vocabulary(checkpoints, tmp_path):
    folder = tiny.build_assistant(tmp_path / "vocab", vocab_size=256)
    with pytest.raises(LoadError, match=r"does not match the target: vocabulary 256 != target vocabulary 384"):
        load(str(checkpoints["text"]), drafter=str(folder))


@pytest.mark.parametrize(
    "target, assistant, problem",
    [
        ("e4b", "e2b", r"backbone_hidden_size 64 != target hidden_size 96"),
        # Equal widths (64): the K/V head counts of the sliding layers tell the sizes apart.
        ("e2b", "26b-a4b", r"layer 0 \(sliding_attention\) is made for 2 K/V heads with 4 query heads; the target has 1"),
        ("26b-a4b", "e2b", r"layer 0 \(sliding_attention\) is made for 1 K/V heads with 4 query heads; the target has 2"),
    ],
)
def test_drafter_of_another_size(family, target, assistant, problem):
    """A pair of different Gemma 4 sizes is refused from their configs, even at equal widths."""
    with pytest.raises(LoadError, match=r"does not match the target: .*" + problem):
        load(str(family(target)["target"]), drafter=str(family(assistant)["assistant"]))


def test_drafter_with_a_longer_window(checkpoints, tmp_path):
    folder = tiny.build_assistant(tmp_path / "window", sliding_window=tiny.WINDOW + 1)
    with pytest.raises(LoadError, match=rf"sliding_window {tiny.WINDOW + 1} > target's {tiny.WINDOW}"):
        load(str(checkpoints["text"]), drafter=str(folder))


def test_invalid_drafter_bits(checkpoints):
    with pytest.raises(LoadError, match=r"must be 4 or 8 bits, got 3"):
        load_drafter(str(checkpoints["assistant"]), quantize_bits=3)


def _draft_tokens(target, drafter, ids, steps=6):
    cache = fresh_cache(target)
    hidden = prefill(target, mx.array(ids[:, :-1]), cache)
    kv, token, out = exact_kv(target, cache), mx.array(ids[:, -1:]), []
    for _ in range(steps):
        h, hidden = drafter.step(target.embed(token), hidden, step_kv(drafter, kv), ids.shape[1] - 1)
        token = drafter.greedy_token(h)
        out.append(token.item())
    return out


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_drafter_loads_and_drafts(checkpoints, bits):
    target, _ = load_target(str(checkpoints["text"]))
    drafter, _ = load_drafter(str(checkpoints["assistant"]), quantize_bits=bits)
    assert drafter.pre_projection.bits == bits
    assert drafter.model.embed_tokens.bits == bits
    ids = np.random.RandomState(2).randint(0, tiny.VOCAB, size=(1, 3 * tiny.WINDOW))
    drafted = _draft_tokens(target, drafter, ids)
    assert len(drafted) == 6 and all(0 <= t < tiny.VOCAB for t in drafted)


def test_prequantized_drafter_checkpoint(checkpoints, tmp_path):
    """An MLX-converted drafter saved quantized (as mlx-community publishes them) loads and
    drafts exactly what the same weights quantized at load time draft."""
    drafter, ckpt = load_drafter(str(checkpoints["assistant"]), quantize_bits=8)
    folder = copy_of(checkpoints["assistant"], tmp_path, "assistant-8bit")
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(drafter.parameters())))
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 8}
    (folder / "config.json").write_text(json.dumps(config))

    reloaded, _ = load_drafter(str(folder))
    target, _ = load_target(str(checkpoints["text"]))
    ids = np.random.RandomState(4).randint(0, tiny.VOCAB, size=(1, 3 * tiny.WINDOW))
    assert _draft_tokens(target, reloaded, ids) == _draft_tokens(target, drafter, ids)
    with pytest.raises(LoadError, match="already quantized"):
        load_drafter(str(folder), quantize_bits=4)


def test_drafter_config_without_text_config(checkpoints, tmp_path):
    folder = copy_of(checkpoints["assistant"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["text_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"drafter .*copy: config.json has no text_config"):
        load_drafter(str(folder))


def test_config_that_is_not_an_object(checkpoints, tmp_path):
    folder = copy_of(checkpoints["text"], tmp_path)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(LoadError, match=r"target .*copy: config.json is not a JSON object"):
        load_target(str(folder))
    (folder / "config.json").write_text("{not json")
    with pytest.raises(LoadError, match=r"not valid JSON"):
        load_target(str(folder))


def test_sizes_by_name_pick_the_4bit_conversion_and_its_assistant(tmp_path, monkeypatch):
    from mlx_spec.models.gemma4.sizes import SIZES as FAMILY
    from mlx_spec.loading import AUTO, resolve_names

    assert resolve_names("e4b", AUTO) == ("mlx-community/gemma-4-e4b-it-4bit", "mlx-community/gemma-4-E4B-it-assistant-bf16")
    assert resolve_names("31B", AUTO) == (FAMILY["31b"].target, FAMILY["31b"].drafter)
    assert resolve_names("12b", AUTO) == ("mlx-community/gemma-4-12B-it-4bit", "mlx-community/gemma-4-12B-it-assistant-bf16")
    # A full id of a known conversion finds its assistant too; a drafter given by name is that size's.
    assert resolve_names(FAMILY["26b-a4b"].target, AUTO) == (FAMILY["26b-a4b"].target, FAMILY["26b-a4b"].drafter)
    assert resolve_names("e4b", "e2b") == (FAMILY["e4b"].target, FAMILY["e2b"].drafter)
    assert resolve_names("e4b", None) == (FAMILY["e4b"].target, None)
    assert resolve_names("someone/model", "other/drafter") == ("someone/model", "other/drafter")
    # A folder of that name wins over the name.
    (tmp_path / "e4b").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_names("e4b", AUTO) == ("e4b", AUTO)


@pytest.mark.parametrize("name", ["e2b", "e4b", "26b-a4b", "31b", "12b"])
def test_auto_drafter_of_a_folder_follows_its_config(name):
    """A target folder (a conversion or fine-tune) gets the assistant of the size it has the
    structure of, read from its config, whatever the folder is called."""
    from mlx_spec.models.gemma4.sizes import SIZES as FAMILY
    from mlx_spec.models.checkpoint import Checkpoint
    from mlx_spec.models.gemma4.loader import drafter_for

    text = {k: v for k, v in FAMILY[name].text.items() if k != "num_kv_shared_layers" or v}  # 0 may be left out
    wrapper = "gemma4_unified" if name == "12b" else "gemma4"
    for config in ({"model_type": wrapper, "text_config": text}, dict(text, model_type=f"{wrapper}_text")):
        assert drafter_for(Checkpoint(Path("x"), config, {})) == FAMILY[name].drafter


def test_auto_drafter_of_an_unknown_structure_is_e2b_s(checkpoints):
    from mlx_spec.loading import DEFAULT_DRAFTER
    from mlx_spec.models.gemma4.loader import drafter_for
    from mlx_spec.models.checkpoint import read_checkpoint

    assert drafter_for(read_checkpoint(checkpoints["text"], "target")) == DEFAULT_DRAFTER


def _edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("damage, message", [
    ("a config.json that is not UTF-8", r"target .*copy/config.json: not valid JSON \(.utf-8. codec can.t decode"),
    ("a quantization_config without its method", r"target .*copy: mlx-lm needs .quant_method., which config.json \(or the weights\) lacks"),
    ("no K/V-computing full layer", r"target .*copy: .*no K/V-computing layer of type \['full_attention'\]"),
    ("weights cut short", r"target .*copy: a weights file \(model\*.safetensors\) is unreadable or incomplete"),
    ("a git-lfs pointer for weights", r"target .*copy: a weights file \(model\*.safetensors\) is unreadable or incomplete"),
])
def test_damaged_checkpoints_are_named_not_tracebacks(checkpoints, tmp_path, damage, message):
    """Each was a raw KeyError, ValueError or UnicodeDecodeError from deep in mlx-lm or json, or
    worded as weights that do not fit (found by a review): a clone without git-lfs, a download
    cut short, a hand-edited config."""
    folder = copy_of(checkpoints["text"], tmp_path)
    weights = folder / "model.safetensors"
    if damage == "a config.json that is not UTF-8":
        (folder / "config.json").write_bytes(b'{"model_type": "gemma4_text\xff"}')
    elif damage == "a quantization_config without its method":
        _edit_config(folder, lambda c: c.update(quantization_config={"bits": 4}))
    elif damage == "no K/V-computing full layer":
        _edit_config(folder, lambda c: c.update(layer_types=["sliding_attention"] * 5 + ["full_attention"] * 5,
                                                num_kv_shared_layers=5))
    elif damage == "weights cut short":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 123456\n")
    with pytest.raises(LoadError, match=message):
        load_target(str(folder))


def test_an_auto_drafter_that_does_not_fit_says_it_was_chosen(family):
    """A target of no known size's structure, the drafter left to "auto": the assistant chosen
    for it does not fit, and the refusal says it was chosen (it named a drafter the user never
    gave, found by a review) and how to pass one or none."""
    import dataclasses

    from mlx_spec.models import GEMMA4, Registry

    chosen = dataclasses.replace(GEMMA4, drafter_for=lambda checkpoint: str(family("e2b")["assistant"]))
    with pytest.raises(LoadError, match=r"does not match the target: .*This drafter was chosen for the target "
                                        r"\(drafter=\"auto\": no known size's structure, the nearest\); .*drafter=None, --no-mtp"):
        load(str(family("e4b")["target"]), registry=Registry([chosen]))
