"""Every Gemma 4 size computes what transformers computes, and decodes exactly.

Tiny checkpoints with the structure of E4B (K/V sharing, 5:1 layers, 2 K/V heads), 26B-A4B
(mixture of experts, keys equal to values on full layers, no K/V sharing, no per-layer
embeddings), 31B (the same attention, dense) and 12B (transformers' gemma4_unified classes: as
31B with a 5:1 pattern, and with K/V sharing and double-wide MLPs, which its config may ask for),
each with its assistant. Which target layers the
assistant reads is checked against transformers' own choice for the config (the layers it marks
"store"), never against the size's name."""

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from mlx_spec import load
from mlx_spec.engine import Engine
from mlx_spec.models import load_drafter, load_target
from mlx_spec.models.gemma4.facts import FULL, SLIDING
from kv import exact_kv, fresh_cache, prefill, step_kv

VARIANTS = ["e4b", "26b-a4b", "31b", "12b", "12b-kv-shared"]
# float32 over wider layers than test_parity's; a wrong formula is off by 1e-2 or more.
TOL = 3e-4
PROMPT_LEN = 3 * tiny.WINDOW + 5
DECODE_LEN = tiny.WINDOW
GENERATE = 3 * tiny.WINDOW  # greedy tokens, well past the window


def random_ids(n, seed=0):
    return np.random.RandomState(seed).randint(0, tiny.VOCAB, size=(1, n))


def reference(folder):
    """transformers' model of the folder's type (Gemma4ForCausalLM, Gemma4UnifiedForCausalLM)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ in ("Gemma4ForCausalLM", "Gemma4UnifiedForCausalLM")
    return model


def reference_assistant(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ in ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
    return model


@pytest.mark.parametrize("variant", ["e2b"] + VARIANTS)
def test_drafter_source_layers_are_the_ones_transformers_stores(family, variant):
    from transformers import AutoConfig

    folder = family(variant)["target"]
    config = AutoConfig.from_pretrained(folder)
    stored = {config.layer_types[i]: i for i, mode in enumerate(config.kv_sharing_modes) if mode == "store"}
    target, _ = load_target(str(folder))
    assert target.kv_layers == stored
    # The structure each variant stands for, read back from the loaded model.
    args = target.args
    shared = {"e2b": 4, "e4b": 4, "26b-a4b": 0, "31b": 0, "12b": 0, "12b-kv-shared": 4}[variant]
    assert args.num_kv_shared_layers == shared
    assert args.enable_moe_block == (variant == "26b-a4b")
    assert args.attention_k_eq_v == (variant in ("26b-a4b", "31b", "12b"))
    assert args.use_double_wide_mlp == (variant in ("e2b", "12b-kv-shared"))
    # The 12B has no per-layer embeddings: its configs never write the keys (mlx-lm's default is E2B's).
    assert (args.hidden_size_per_layer_input == 0) == (variant in ("26b-a4b", "31b", "12b", "12b-kv-shared"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_target_matches_transformers_prefill_and_decode(family, variant):
    folder = family(variant)["target"]
    ids = random_ids(PROMPT_LEN + DECODE_LEN)
    with torch.no_grad():
        out = reference(folder)(torch.tensor(ids), output_hidden_states=True)
    target, _ = load_target(str(folder))
    cache = fresh_cache(target)
    logits, hidden = [], []
    chunks = [(0, 7), (7, 30), (30, PROMPT_LEN)] + [(i, i + 1) for i in range(PROMPT_LEN, PROMPT_LEN + DECODE_LEN)]
    for lo, hi in chunks:
        l, h = target(mx.array(ids[:, lo:hi]), cache)
        logits.append(np.array(l)[0])
        hidden.append(np.array(h)[0])
    assert np.abs(np.concatenate(logits) - out.logits.numpy()[0]).max() <= TOL
    assert np.abs(np.concatenate(hidden) - out.hidden_states[-1].numpy()[0]).max() <= TOL


def reference_state(folder, ids):
    """transformers' target, its hidden state of the last position and the K/V it shares."""
    model = reference(folder)
    with torch.no_grad():
        out = model(torch.tensor(ids), output_hidden_states=True, return_shared_kv_states=True)
    return model, out.hidden_states[-1][:, -1:], dict(out.shared_kv_states)


@pytest.mark.parametrize("variant", VARIANTS)
def test_drafter_reads_the_kv_transformers_gives_it(family, variant):
    folder = family(variant)["target"]
    ids = random_ids(3 * tiny.WINDOW + 2, seed=7)
    _, ref_hidden, ref_kv = reference_state(folder, ids)
    target, _ = load_target(str(folder))
    cache = fresh_cache(target)
    hidden = prefill(target, mx.array(ids), cache, chunk=tiny.WINDOW - 3)
    assert np.abs(np.array(hidden) - ref_hidden.numpy()).max() <= TOL
    span = {SLIDING: tiny.WINDOW + 1, FULL: ids.shape[1]}
    for kind, (keys, values) in exact_kv(target, cache).items():
        ref_keys, ref_values = (x.numpy()[..., -span[kind] :, :] for x in ref_kv[kind])
        assert keys.shape == ref_keys.shape
        assert np.abs(np.array(keys) - ref_keys).max() <= TOL
        assert np.abs(np.array(values) - ref_values).max() <= TOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_drafter_matches_transformers_over_several_steps(family, variant):
    folders = family(variant)
    ids = random_ids(3 * tiny.WINDOW + 3, seed=7)
    ref_target, ref_hidden, ref_kv = reference_state(folders["target"], ids[:, :-1])
    ref_drafter = reference_assistant(folders["assistant"])
    drafter, _ = load_drafter(str(folders["assistant"]))
    kv = {k: (mx.array(v[0].numpy()), mx.array(v[1].numpy())) for k, v in ref_kv.items()}
    kv[SLIDING] = tuple(x[..., -(tiny.WINDOW + 1) :, :] for x in kv[SLIDING])
    token = torch.tensor(ids[:, -1:])
    position = ids.shape[1] - 1
    for _ in range(3):
        embedding = ref_target.get_input_embeddings()(token).detach()
        with torch.no_grad():
            r = ref_drafter(
                inputs_embeds=torch.cat([embedding, ref_hidden], dim=-1),
                position_ids=torch.tensor([[position]]),
                shared_kv_states=ref_kv,
            )
        h, next_hidden = drafter.step(mx.array(embedding.numpy()), mx.array(ref_hidden.numpy()), step_kv(drafter, kv),
                                      position)
        ref_logits = r.logits.numpy()[0, 0]
        full = np.array(drafter.full_logits(h))[0, 0]
        kept = ref_logits > ref_logits.min()  # the centroid head's candidates (all ids without it)
        if not drafter.config.use_ordered_embeddings:
            kept[:] = True
        assert np.array_equal(np.isfinite(full), kept)
        assert np.abs(full[kept] - ref_logits[kept]).max() <= TOL
        assert np.abs(np.array(next_hidden) - r.last_hidden_state.numpy()).max() <= TOL
        assert drafter.greedy_token(h).item() == int(ref_logits.argmax())
        token, ref_hidden = torch.tensor([[int(ref_logits.argmax())]]), r.last_hidden_state


def family_engine(folders):
    loaded = load(str(folders["target"]), str(folders["assistant"]))
    return Engine.of(loaded.target, loaded.assistant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_mtp_on_equals_off_equals_transformers(family, variant):
    folders = family(variant)
    prompt = random_ids(2 * tiny.WINDOW, seed=11)
    model = reference(folders["target"])
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = model.generate(torch.tensor(prompt), max_new_tokens=GENERATE, do_sample=False)[0].tolist()
    expected = expected[prompt.shape[1] :]
    assert len(expected) == GENERATE
    engine = family_engine(folders)
    prompt = prompt[0].tolist()
    assert engine.generate(prompt, max_tokens=GENERATE, mtp=False).tokens == expected
    mtp = engine.generate(prompt, max_tokens=GENERATE, lookup=False)
    assert mtp.tokens == expected
    assert mtp.stats.drafted > 0
    for g in (1, 3, 6):
        assert engine.generate(prompt, max_tokens=GENERATE, draft_tokens=g, lookup=False).tokens == expected, g


@pytest.mark.parametrize("variant, seed", [("31b", 7), ("12b-kv-shared", 11)])
def test_same_seed_same_tokens_with_and_without_mtp(family, variant, seed):
    """A seed gives the same tokens with and without MTP: on a target with keys equal to values
    and no K/V sharing (31B), and on the 12B's classes with K/V sharing and double-wide MLPs."""
    engine = family_engine(family(variant))
    prompt = random_ids(2 * tiny.WINDOW + 5, seed=3)[0].tolist()
    settings = dict(temperature=1.0, top_k=64, top_p=0.95, seed=seed)
    off = engine.generate(prompt, max_tokens=4 * tiny.WINDOW, mtp=False, **settings)
    on = engine.generate(prompt, max_tokens=4 * tiny.WINDOW, lookup=False, **settings)
    assert on.tokens == off.tokens
    assert on.stats.drafted > 0


def test_assistant_with_a_shorter_window_than_its_target(checkpoints, tmp_path):
    """An assistant whose sliding window is shorter than the target's reads the last
    `its window + 1` positions, as transformers' assistant mask does with the target's whole K/V;
    decoding with it stays exact."""
    from transformers import Gemma4AssistantForCausalLM

    window = tiny.WINDOW - 4
    folder = tiny.build_assistant(tmp_path / "short", ordered=False, sliding_window=window)
    ids = random_ids(3 * tiny.WINDOW + 3, seed=5)
    ref_target, ref_hidden, ref_kv = reference_state(checkpoints["text"], ids[:, :-1])
    ref_drafter = Gemma4AssistantForCausalLM.from_pretrained(folder).eval()
    embedding = ref_target.get_input_embeddings()(torch.tensor(ids[:, -1:])).detach()
    position = ids.shape[1] - 1
    with torch.no_grad():
        r = ref_drafter(
            inputs_embeds=torch.cat([embedding, ref_hidden], dim=-1),
            position_ids=torch.tensor([[position]]),
            shared_kv_states=ref_kv,  # every position: the mask alone limits the window
        )
    target, _ = load_target(str(checkpoints["text"]))
    cache = fresh_cache(target)
    prefill(target, mx.array(ids[:, :-1]), cache)
    drafter, _ = load_drafter(str(folder))
    h, _ = drafter.step(mx.array(embedding.numpy()), mx.array(ref_hidden.numpy()),
                        step_kv(drafter, exact_kv(target, cache)), position)
    assert np.abs(np.array(drafter.full_logits(h))[0, 0] - r.logits.numpy()[0, 0]).max() <= TOL

    engine = family_engine({"target": checkpoints["text"], "assistant": folder})
    prompt = ids[0].tolist()
    off = engine.generate(prompt, max_tokens=GENERATE, mtp=False)
    on = engine.generate(prompt, max_tokens=GENERATE, lookup=False)
    assert on.tokens == off.tokens and on.stats.drafted > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_google_layout_loads_to_the_same_model(family, variant, tmp_path):
    """Google ships each size as Gemma4ForConditionalGeneration (text weights under
    model.language_model, vision and audio towers beside); experts and keys-equal-values layers
    load from it to the same model."""
    google = tiny.build_target(tmp_path / "google", layout="google", variant=variant, tokenizer=False)
    ids = mx.array(random_ids(2 * tiny.WINDOW, seed=9))
    a, _ = load_target(str(family(variant)["target"]))
    b, _ = load_target(str(google))
    assert np.array_equal(np.array(a(ids, fresh_cache(a))[0]), np.array(b(ids, fresh_cache(b))[0]))


@pytest.mark.parametrize("variant", ["12b", "12b-kv-shared"])
def test_12b_google_layout_matches_transformers_multimodal_model_on_text(family, variant, tmp_path):
    """Google ships the 12B as Gemma4UnifiedForConditionalGeneration: its text weights under
    model.language_model and the encoder-free embedders (model.vision_embedder, model.embed_vision,
    model.embed_audio) beside them. Loaded from that layout, our target gives transformers'
    multimodal model's own logits on a text prompt past the window (the config's
    `use_bidirectional_attention: "vision"` leaves text causal there too)."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    google = tiny.build_target(tmp_path / "google", layout="google", variant=variant, tokenizer=False)
    ids = random_ids(2 * tiny.WINDOW + 7, seed=4)
    reference_model = Gemma4UnifiedForConditionalGeneration.from_pretrained(google).eval()
    assert reference_model.config.text_config.use_bidirectional_attention == "vision"
    with torch.no_grad():
        expected = reference_model(input_ids=torch.tensor(ids)).logits.numpy()[0]
    target, _ = load_target(str(google))
    cache = fresh_cache(target)
    logits = [np.array(target(mx.array(ids[:, lo:hi]), cache)[0])[0]
              for lo, hi in [(0, 9), (9, 2 * tiny.WINDOW)] + [(i, i + 1) for i in range(2 * tiny.WINDOW, ids.shape[1])]]
    assert np.abs(np.concatenate(logits) - expected).max() <= TOL


@pytest.mark.parametrize("variant", ["12b", "12b-kv-shared"])
def test_12b_sampled_tokens_follow_the_target_s_distribution(family, variant):
    """1,000 seeded generations with the 12B's assistant drawing its guesses from its own
    distribution (the min(1, p/q) rule): the first and second tokens follow the target's exact
    distributions (chi-square, as test_sampling's end-to-end test for E2B)."""
    from test_sampling import ALPHA, SETTINGS, chi_square_p, exact_first_two, first_tokens

    from mlx_spec.drafting import MTPDrafter
    from mlx_spec.sampling.settings import SamplingSettings

    engine = family_engine(family(variant))
    prompt = random_ids(3 * tiny.WINDOW, seed=1)[0].tolist()
    p0, p1 = exact_first_two(engine, prompt, SamplingSettings(**SETTINGS[1]))
    drafter = MTPDrafter(engine.assistant, engine.target, sample=True)
    tokens = first_tokens(engine, prompt, SETTINGS[1], drafter, 1_000)
    assert chi_square_p(np.bincount(tokens[:, 0], minlength=tiny.VOCAB), p0) > ALPHA
    assert chi_square_p(np.bincount(tokens[:, 1], minlength=tiny.VOCAB), p1) > ALPHA


def test_a_12b_target_with_another_size_s_assistant_is_refused(family):
    from mlx_spec import LoadError

    with pytest.raises(LoadError, match=r"does not match the target"):
        load(str(family("12b")["target"]), str(family("e2b")["assistant"]))
    with pytest.raises(LoadError, match=r"does not match the target"):
        load(str(family("e4b")["target"]), str(family("12b")["assistant"]))


def test_a_bidirectional_text_model_is_refused(family, tmp_path):
    """`use_bidirectional_attention: "all"` makes every token attend both ways: no causal model
    to decode, and a clear error rather than wrong tokens."""
    import json
    import shutil

    from mlx_spec import LoadError

    folder = tmp_path / "all"
    shutil.copytree(family("12b")["target"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["use_bidirectional_attention"] = "all"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"use_bidirectional_attention is \"all\".*not a causal language model"):
        load_target(str(folder))


@pytest.mark.parametrize("config_change", ["full layers' head size is head_dim", "no layer_types"])
def test_configs_transformers_completes_are_read_as_it_reads_them(tmp_path, config_change):
    """Two configs transformers reads with its own defaults, found by a review: full layers
    whose head size equals head_dim (transformers 5.24 then writes no override, and mlx-lm
    took 512: the weights did not fit), and a config without `layer_types` (transformers: five
    sliding layers to one full, the last full; mlx-lm's default is four to one, and the memory
    check counted no K/V). Each loads to transformers' logits and counts its K/V."""
    import json

    from transformers import Gemma4ForCausalLM

    from mlx_spec import memory

    torch.manual_seed(0)
    overrides = {"global_head_dim": 32} if config_change.startswith("full") else {}
    model = Gemma4ForCausalLM(tiny._text_config(**overrides))
    tiny._randomise(model, 0)
    if config_change == "no layer_types":  # what transformers builds from the config without them
        config = model.config.to_dict()
        config.pop("layer_types"), config.pop("per_layer_config")
        config["global_head_dim"] = tiny.GLOBAL_HEAD_DIM
        model = Gemma4ForCausalLM(type(model.config)(**config))
        tiny._randomise(model, 0)
    model.eval().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    if config_change == "no layer_types":
        saved.pop("layer_types", None), saved.pop("per_layer_config", None)
        saved["global_head_dim"] = tiny.GLOBAL_HEAD_DIM  # as the published configs state it
        (tmp_path / "config.json").write_text(json.dumps(saved))
    else:
        assert "global_head_dim" not in saved and not saved["per_layer_config"]
    ids = random_ids(PROMPT_LEN)
    with torch.no_grad():
        expected = Gemma4ForCausalLM.from_pretrained(tmp_path).eval()(torch.tensor(ids)).logits.numpy()[0]
    target, _ = load_target(str(tmp_path))
    logits, _ = target(mx.array(ids), fresh_cache(target))
    assert np.abs(np.array(logits)[0] - expected).max() <= TOL
    assert memory.kv_cache_bytes(json.loads((tmp_path / "config.json").read_text()), 1000) > 0
