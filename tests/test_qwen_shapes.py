"""`bench --random-weights --shape qwen...`: Qwen's published shapes, built with random weights
as the bench builds them (mlx-lm's network, 4-bit, the MTP layer beside it)."""

from types import SimpleNamespace

import pytest

from mlx_spec.bench.common import SHAPES as BENCH_SHAPES
from mlx_spec.models.qwen3_5.shapes import SHAPES
from mlx_spec.options import Options


def parameters(text: dict) -> int:
    """The text model's parameters in mlx-lm's network of this config (lazy: nothing allocated)."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    module = qwen3_5_moe if "moe" in text["model_type"] else qwen3_5
    model = module.Model(module.ModelArgs.from_dict({"model_type": text["model_type"][:-len("_text")],
                                                     "text_config": text}))
    return sum(v.size for _, v in tree_flatten(model.parameters()))


@pytest.mark.parametrize("name, billions", [("qwen3.5-0.8b", (0.7, 0.8)), ("qwen3.6-27b", (26, 27.5)),
                                            ("qwen3.6-35b-a3b", (34, 35.5))])
def test_each_shape_is_as_large_as_its_name_says(name, billions):
    """A mistyped width or count shows in the total (the names count the vision tower too)."""
    assert name in BENCH_SHAPES
    low, high = billions
    assert low * 1e9 < parameters(SHAPES[name]) < high * 1e9


@pytest.mark.parametrize("name", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_a_random_shape_decodes_exactly_with_its_mtp_layer(name, monkeypatch):
    """The bench's builder, on the shape's structure at toy widths (the real ones run for minutes
    on a CPU): 4-bit, an untied head made in chunks, the MTP layer joined; MTP on, at a fixed
    length and adaptive, gives MTP off's tokens."""
    from mlx_spec.bench import random_qwen
    from mlx_spec.bench.models import build_engine

    small = dict(SHAPES[name], hidden_size=128, num_hidden_layers=8, vocab_size=1024, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=64, linear_value_head_dim=64)
    small.update(intermediate_size=256) if "intermediate_size" in small else small.update(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    monkeypatch.setitem(random_qwen.SHAPES, name, small)
    engine = build_engine(SimpleNamespace(random_weights=True, shape=name, model=None, drafter=None))
    engine = engine.with_stop_tokens([])
    assert engine.target.text_model.layers[0].linear_attn.in_proj_qkv.bits == 4
    prompt = [5, 17, 300, 42, 9, 17, 300, 42, 9] * 3
    off = engine.generate(prompt, Options(max_tokens=24, mtp=False)).tokens
    for g in (1, 3, None):
        answer = engine.generate(prompt, Options(max_tokens=24, draft_tokens=g))
        assert answer.tokens == off, g
        assert answer.stats.drafted_by_source.get("mtp", 0) > 0 or g is None
