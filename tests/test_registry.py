"""A model family is a folder and a registry entry: a family the package does not know (mlx-lm's
Llama, tests/toy_family.py) loads, decodes with drafting exactly as mlx-lm decodes it alone, and
is counted by the memory check, with nothing of mlx-spec edited."""

import mlx.core as mx
import pytest

import mlx_spec
from mlx_spec import memory
from mlx_spec.errors import LoadError
from mlx_spec.models import FAMILIES
from toy_family import CONFIG, TOY, save_toy_checkpoint

REGISTRY = FAMILIES.with_family(TOY)
PROMPT = [5, 17, 42, 99, 7, 3, 250, 18] * 6


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return save_toy_checkpoint(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def engine(toy):
    return mlx_spec.load(str(toy), registry=REGISTRY)


def mlx_lm_greedy(model, prompt, n):
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=n)
    return [int(token) for token, _ in steps]


def test_the_family_loads_through_its_registry_entry(engine):
    assert engine.pair.family is TOY
    assert engine.mtp_drafter is None  # the family names no drafter: lookup alone drafts
    assert engine.context_length == CONFIG["max_position_embeddings"]
    assert TOY not in FAMILIES.families  # the default registry was left as it was
    assert [f.name for f in FAMILIES.families] == ["Gemma 4", "Qwen3.5"]


def test_the_default_registry_refuses_it_by_its_model_type(toy):
    with pytest.raises(LoadError, match="model_type 'toy_llama' is not one of"):
        mlx_spec.load(str(toy))


def test_greedy_drafting_gives_mlx_lm_s_own_tokens(engine):
    n = 120
    expected = mlx_lm_greedy(engine.target.model, PROMPT, n)
    drafted = engine.generate(PROMPT, max_tokens=n)
    assert drafted.tokens == expected
    assert engine.generate(PROMPT, max_tokens=n, mtp=False).tokens == expected
    assert drafted.stats.drafted_by_source.get("lookup", 0) > 0  # the loop did draft for this family
    fixed = engine.generate(PROMPT, max_tokens=n, draft_tokens=4)
    assert fixed.tokens == expected


def test_sampling_with_a_seed_gives_the_tokens_of_decoding_alone(engine):
    settings = dict(temperature=1.0, top_k=20, top_p=0.9, seed=11, max_tokens=80)
    alone = engine.generate(PROMPT, mtp=False, **settings).tokens
    assert engine.generate(PROMPT, **settings).tokens == alone
    assert engine.generate(PROMPT, draft_tokens=3, **settings).tokens == alone


def test_the_memory_check_counts_the_family_s_cache(toy):
    estimate = memory.estimate(str(toy), None, context=1000, registry=REGISTRY)
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    assert estimate.kv_cache == CONFIG["num_hidden_layers"] * 2 * CONFIG["num_key_value_heads"] * head_dim * 1000 * 4
    assert estimate.weights == (toy / "model.safetensors").stat().st_size
