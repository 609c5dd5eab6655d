"""The memory check: weights as on disk plus the K/V cache at the requested context, compared
with what the machine has, before anything is downloaded."""

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlx_spec import LoadError, load, memory
from mlx_spec.models.gemma4.sizes import SIZES as FAMILY
from mlx_spec.models import load_target
from kv import fresh_cache, prefill


def folder_bytes(folder):
    return sum(f.stat().st_size for f in folder.glob("model*.safetensors"))


def test_estimate_is_the_files_plus_the_kv_cache(checkpoints):
    target, assistant = str(checkpoints["text"]), str(checkpoints["assistant"])
    estimate = memory.estimate(target, assistant, context=1024)
    assert estimate.weights == folder_bytes(checkpoints["text"]) + folder_bytes(checkpoints["assistant"])
    assert memory.estimate(target, None, context=1024).weights == folder_bytes(checkpoints["text"])
    assert estimate.kv_cache == memory.kv_cache_bytes(memory.read_config(checkpoints["text"] / "config.json"), 1024)


def test_a_context_past_the_model_s_own_counts_the_model_s(checkpoints, monkeypatch):
    """The tiny target attends over 4,096 positions: asked for ten million, the check counted
    their K/V and refused a load on a machine with room for all the model can hold (found by a
    review)."""
    target = str(checkpoints["text"])
    config = memory.read_config(checkpoints["text"] / "config.json")
    own = config.get("text_config", config)["max_position_embeddings"]
    at_own = memory.estimate(target, None, context=own)
    past = memory.estimate(target, None, context=10_000_000)
    assert (past.kv_cache, past.context) == (at_own.kv_cache, own)
    assert "at 4096 tokens" in past.describe()
    monkeypatch.setattr(memory, "available_bytes", lambda: at_own.total)
    assert load(target, None, context=10_000_000).context_length == own


@pytest.mark.parametrize("variant", ["e2b", "26b-a4b", "12b"])
def test_kv_estimate_covers_the_real_cache(family, variant):
    """After a prompt of `context` tokens the caches hold at most the estimate, and not much less:
    K/V-shared layers hold nothing, full layers the whole context, sliding ones about a window."""
    folder = family(variant)["target"]
    target, _ = load_target(str(folder))
    context = 1024
    cache = fresh_cache(target)
    prefill(target, mx.array(np.random.RandomState(0).randint(0, tiny.VOCAB, size=(1, context))), cache)
    mx.eval([c.keys for c in cache])
    actual = sum(c.nbytes for c in cache)
    estimate = memory.kv_cache_bytes(memory.read_config(folder / "config.json"), context)
    assert actual <= estimate <= 1.5 * actual


def test_published_kv_cache_sizes():
    """From the published configs: 31B keeps 10 full layers of 4 K/V heads x 512 (keys and
    values, bf16) per token; 12B 8 full layers of 1 head x 512; E2B 3 full layers of 1 head x
    512, its other 20 layers share."""
    per_token = {name: (memory.kv_cache_bytes(size.text, 2 * 65536) - memory.kv_cache_bytes(size.text, 65536)) / 65536
                 for name, size in FAMILY.items()}
    assert per_token["31b"] == 10 * 2 * 4 * 512 * 2
    assert per_token["12b"] == 8 * 2 * 1 * 512 * 2
    assert per_token["26b-a4b"] == 5 * 2 * 2 * 512 * 2
    assert per_token["e4b"] == 4 * 2 * 2 * 512 * 2
    assert per_token["e2b"] == 3 * 2 * 1 * 512 * 2


def test_too_big_for_this_machine_is_a_load_error_unless_forced(checkpoints, monkeypatch):
    target, assistant = str(checkpoints["text"]), str(checkpoints["assistant"])
    needed = memory.estimate(target, assistant, context=4096)
    monkeypatch.setattr(memory, "available_bytes", lambda: needed.total - 1)
    with pytest.raises(LoadError, match=r"needs about .* GB of K/V cache at 4096 tokens\), and this machine has .*force=True \(--force\)"):
        load(target, assistant, context=4096)
    engine = load(target, assistant, context=4096, force=True)
    assert engine.assistant is not None
    monkeypatch.setattr(memory, "available_bytes", lambda: needed.total)
    assert load(target, assistant, context=4096).assistant is not None


def test_cli_force_and_context_reach_the_check(checkpoints, monkeypatch):
    from click.testing import CliRunner

    from mlx_spec.cli import cli

    monkeypatch.setattr(memory, "available_bytes", lambda: 1)
    args = ["generate", "--model", str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"]),
            "--raw", "-p", "Hello", "-m", "2"]
    refused = CliRunner().invoke(cli, args + ["--context", "2048"])
    assert isinstance(refused.exception, LoadError) and "at 2048 tokens" in str(refused.exception)
    forced = CliRunner().invoke(cli, args + ["--force"])
    assert forced.exit_code == 0, forced.output


def test_unknown_sizes_skip_the_check(monkeypatch):
    """Offline and not downloaded: nothing to estimate, and the download reports the problem."""
    assert memory.estimate("nobody/no-such-model-here", None) is None


def test_published_configs_have_the_sizes_their_names_say():
    """The family table's text configs, built lazily with mlx-lm (nothing is allocated), have the
    parameter counts the names promise: E2B / E4B "effective" (without the per-layer embedding
    table), 26B-A4B in total and about 4B active per token (8 of 128 experts), 31B, 12B."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import gemma4_text

    def counts(name):
        text = FAMILY[name].text
        model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(dict(text, model_type="gemma4_text")))
        params = dict(tree_flatten(model.parameters()))
        total = sum(v.size for v in params.values())
        ple = sum(v.size for k, v in params.items() if "embed_tokens_per_layer" in k)
        experts = sum(v.size for k, v in params.items() if ".experts." in k)
        active = total - ple - experts + experts * text.get("top_k_experts", 0) // text.get("num_experts", 1)
        return total / 1e9, (total - ple) / 1e9, active / 1e9

    assert 2.0 < counts("e2b")[1] < 2.5
    assert 4.0 < counts("e4b")[1] < 5.0
    total, _, active = counts("26b-a4b")
    assert 25 < total < 27 and 3.5 < active < 4.5
    assert 30 < counts("31b")[0] < 32
    assert 11.5 < counts("12b")[0] < 12.5


def test_before_downloading_the_hub_listing_and_the_published_config_are_used(monkeypatch):
    """A size not downloaded yet: its weights as the hub lists them (no weights fetched), its K/V
    cache from the published config; too big for a 16 GB machine, fine on 64 GB."""
    from types import SimpleNamespace

    import huggingface_hub

    listing = {
        FAMILY["31b"].target: [("model-00001-of-00002.safetensors", 10 * 10**9),
                               ("model-00002-of-00002.safetensors", 8 * 10**9), ("config.json", 10**4)],
        FAMILY["31b"].drafter: [("model.safetensors", 9 * 10**8)],
    }
    asked = []

    def model_info(self, repo_id, files_metadata=False):
        asked.append(repo_id)
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=f, size=n) for f, n in listing[repo_id]])

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    needed = memory.estimate(FAMILY["31b"].target, FAMILY["31b"].drafter, context=8192)
    assert needed.weights == 18 * 10**9 + 9 * 10**8
    assert needed.kv_cache == memory.kv_cache_bytes(FAMILY["31b"].text, 8192)
    assert sorted(asked) == sorted(listing)
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 10**9)
    with pytest.raises(LoadError, match=r"target mlx-community/gemma-4-31b-it-4bit: .* needs about 20\.9 GB"):
        load("31b")
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 * 10**9)
    assert memory.check(FAMILY["31b"].target, FAMILY["31b"].drafter) is not None


def test_one_rank_of_a_group_counts_its_share(monkeypatch):
    """The 31B in bf16 (62.5 GB of files) does not fit one 48 GB Mac (about 36 GB for the GPU),
    and reads as fitting on each of two: a rank holds half of the split weights (heads, MLP,
    K/V heads) and the whole of the rest (embeddings), half of the K/V cache."""
    from types import SimpleNamespace

    import huggingface_hub

    from mlx_spec.models.gemma4.tensor_parallel import rank_share

    listing = {FAMILY["31b"].target: [("model-00001-of-00002.safetensors", 31_250_000_000),
                                      ("model-00002-of-00002.safetensors", 31_250_000_000)],
               FAMILY["31b"].drafter: [("model.safetensors", 9 * 10**8)]}
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo_id, files_metadata=False: SimpleNamespace(
        siblings=[SimpleNamespace(rfilename=f, size=n) for f, n in listing[repo_id]]))
    monkeypatch.setattr(memory, "available_bytes", lambda: 36 * 10**9)
    with pytest.raises(LoadError, match="needs about"):
        memory.check(FAMILY["31b"].target, FAMILY["31b"].drafter)
    share = memory.check(FAMILY["31b"].target, FAMILY["31b"].drafter, ranks=2)
    whole = memory.estimate(FAMILY["31b"].target, FAMILY["31b"].drafter)
    weights, cache = rank_share(FAMILY["31b"].text, 2)
    assert 0.5 < weights < 0.55 and cache == 0.5  # the embeddings (1.4B of 31B parameters) stay whole
    assert share.weights == int(62_500_000_000 * weights) + 9 * 10**8 and share.kv_cache == whole.kv_cache // 2
    assert share.total < 36 * 10**9 < whole.total
    with pytest.raises(LoadError, match=r"one rank's share of 2"):
        monkeypatch.setattr(memory, "available_bytes", lambda: 20 * 10**9)
        memory.check(FAMILY["31b"].target, FAMILY["31b"].drafter, ranks=2)


def test_a_mixture_s_experts_split_or_whole_by_choice():
    """The 26B-A4B's 128 experts are most of its weights: kept whole on every rank, a rank of two
    holds almost all of them; divided, about half. A group whose size does not divide the
    experts cannot divide them, and says so."""
    from mlx_spec.models.gemma4.tensor_parallel import rank_share, split_problems

    config = FAMILY["26b-a4b"].text
    assert rank_share(config, 2)[0] > 0.95 and 0.5 < rank_share(config, 2, "split")[0] < 0.53
    assert split_problems(config, 2, "split") == []
    assert {"its 16 query heads", "its 128 experts"} <= set(split_problems(config, 3, "split"))
    assert "its 128 experts" not in split_problems(config, 3)  # kept whole, any group size holds them
    six = dict(config, num_attention_heads=24, num_key_value_heads=6, num_global_key_value_heads=6,
               intermediate_size=2112 * 3)
    assert split_problems(six, 6, "split") == ["its 128 experts"] and split_problems(six, 6) == []
    assert "one of whole, split" in split_problems(config, 2, "halved")[0]


def test_a_k_v_head_the_ranks_share_is_counted_whole_on_each():
    """The 12B's full layers have one K/V head (every rank keeps it) and hold the whole context,
    so at 128k tokens a rank of two keeps nearly all of the cache; the 31B's heads all split:
    half of it."""
    from mlx_spec.models.gemma4.tensor_parallel import rank_share

    assert rank_share(FAMILY["12b"].text, 2, context=131072)[1] > 0.85
    assert rank_share(FAMILY["31b"].text, 2, context=131072)[1] == pytest.approx(0.5)
    # The server's admission counts a row's K/V as a rank holds it (server/admission.py).
    for size, share in (("12b", 0.85), ("31b", 0.5)):
        whole, rank = (memory.kv_cache_bytes(FAMILY[size].text, 131072, ranks=n) for n in (1, 2))
        held = rank_share(FAMILY[size].text, 2, "whole", 131072, memory.SLIDING_SLACK)[1]
        assert rank == int(whole * held) and rank >= share * whole - 1


def test_a_quantized_mlp_splits_in_whole_groups_or_is_refused():
    """The 4-bit 26B-A4B's MLP (2112 wide, 33 groups of 64) cannot be cut in two along its
    groups: refused by name before loading, rather than failing inside MLX."""
    from mlx_spec.models.gemma4.tensor_parallel import split_problems

    quantized = dict(FAMILY["26b-a4b"].text, quantization={"group_size": 64, "bits": 4})
    assert "its MLP width 2112 in whole quantization groups of 64" in split_problems(quantized, 2)
    assert split_problems(FAMILY["26b-a4b"].text, 2) == []  # in bf16 it splits
    assert split_problems(dict(FAMILY["31b"].text, quantization={"group_size": 64, "bits": 4}), 2) == []


def test_the_auto_drafter_of_a_folder_is_counted(checkpoints, monkeypatch):
    """A target given as a folder (or a hub id not known by name) with the drafter left to
    "auto": the drafter its family names for it is counted when the hub lists it (it was left
    out, found by a review), and offline the target alone is still checked."""
    import huggingface_hub
    from types import SimpleNamespace

    target = str(checkpoints["text"])
    drafter = FAMILY["e2b"].drafter  # a config of no known size drafts with E2B's assistant

    def model_info(self, repo_id, files_metadata=False):
        assert repo_id == drafter
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename="model.safetensors", size=3 * 10**9)])

    alone = folder_bytes(checkpoints["text"])
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    needed = memory.estimate(target, "auto", context=1024)
    assert needed.weights == alone + 3 * 10**9 and needed.drafter == drafter
    monkeypatch.setattr(memory, "available_bytes", lambda: needed.total - 1)
    with pytest.raises(LoadError, match=rf"{target} \+ {drafter} needs about 3\.0 GB"):
        load(target)

    def offline(self, repo_id, files_metadata=False):
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", offline)
    assert memory.estimate(target, "auto", context=1024).weights == alone
    assert memory.estimate(target, drafter, context=1024) is None  # a drafter named: unknown means unknown
