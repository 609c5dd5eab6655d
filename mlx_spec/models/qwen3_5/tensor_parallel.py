"""Qwen3.5 split over a group of processes (mlx.core.distributed), tensor-parallel: the target
as mlx-lm's own `shard()` splits it, and the MTP layer as that same code splits a full-attention
decoder layer of the target's.

Every rank holds a share of each layer's heads: the Gated DeltaNet layers' key and value heads
(their convolution, state and stash with them), the attention layers' query heads and K/V heads
(repeated where there are fewer K/V heads than ranks), each MLP's and expert's inner width, and
a slice of the vocabulary of an untied head (gathered for the logits). Each rank's storage holds
its own heads' K/V and recurrent state; every row's replay runs on every rank in step, so the
rollback stays exact per rank (tests/test_distributed.py).
"""

from types import SimpleNamespace
from typing import List, Tuple

import mlx.core as mx

from ...errors import LoadError
from .facts import LinearDims, full_attention_layers, kv_cache_bytes
from .loader import mtp_layers_of, text_config


def split_problems(config: dict, size: int) -> List[str]:
    """What `size` ranks cannot split evenly in a config (empty: it splits)."""
    text, problems = text_config(config), []
    heads = {"num_attention_heads": "query heads", "linear_num_key_heads": "Gated DeltaNet key heads",
             "linear_num_value_heads": "Gated DeltaNet value heads"}
    widths = {"intermediate_size": "MLP width", "moe_intermediate_size": "experts' width",
              "shared_expert_intermediate_size": "shared expert's width"}
    for key, what in {**heads, **widths}.items():
        value = text.get(key)
        if isinstance(value, int) and value and value % size:
            problems.append(f"its {value} {what}")
    kv = text.get("num_key_value_heads")
    if isinstance(kv, int) and kv % size and size % kv:
        problems.append(f"its {kv} K/V heads")
    if not text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)) and text.get("vocab_size", 0) % size:
        problems.append(f"its vocabulary of {text.get('vocab_size')}")
    return problems


def check_split(config: dict, size: int, path, experts: str = "whole") -> None:
    """A LoadError, before any weight is read, where `size` ranks cannot split this target."""
    if experts == "split":
        raise LoadError(f"target {path}: Qwen3.5's experts stay on every rank, each rank holding a share of every "
                        "expert's width (as mlx-lm splits them); experts=\"split\" (--experts split) is for Gemma 4's "
                        "26b-a4b")
    problems = split_problems(config, size)
    if problems:
        raise LoadError(f"target {path}: a group of {size} cannot split " + ", ".join(problems) +
                        " evenly; run it on a group whose size divides them (1 runs it whole)")


def split_pair(target, draft, group: mx.distributed.Group, experts: str = "whole") -> None:
    """The target split by mlx-lm's `shard()`, and the MTP layer (if any) by the same code: it
    is one decoder layer of the target's kind, and its fc and norms stay whole on every rank."""
    from mlx_lm.models import qwen3_5

    target.model.shard(group)
    if draft is not None:
        # mlx-lm's shard() walks `self.layers` and reads the head's tie from `language_model`:
        # the MTP layer's one decoder layer, with no head of its own to split.
        alone = SimpleNamespace(layers=draft.layer.layers,
                                language_model=SimpleNamespace(args=SimpleNamespace(tie_word_embeddings=True)))
        qwen3_5.Model.shard(alone, group)


def rank_share(config: dict, size: int, experts: str = "whole", context: int = 8192,
               sliding_slack: int = 0) -> Tuple[float, float]:
    """(weights, caches): the share of the whole that one rank of `size` holds, as `shard()`
    splits it. Split over the group: every projection of the Gated DeltaNet layers (and their
    convolution), the query and output heads, each MLP's and expert's inner width, and an untied
    head's vocabulary; the K/V heads by those a rank keeps (a head shared by ranks is whole on
    each); the embedding, the MTP layer's fc and every router whole. Caches: a rank's K/V heads
    and its share of the recurrent states. The memory check scales the files and caches by them."""
    text = text_config(config)
    width, heads = text["hidden_size"], text["num_attention_heads"]
    head_dim = text.get("head_dim") or width // heads
    kv = text["num_key_value_heads"]
    kept = kv // size if kv % size == 0 else 1
    dims = LinearDims.of(text)
    key_dim, value_heads, value_dim, kernel = dims.key_dim, dims.value_heads, dims.value_dim, dims.kernel
    full, mtp = full_attention_layers(text), mtp_layers_of(text)
    linear = text["num_hidden_layers"] - full
    experts_count = text.get("num_experts") or 0
    mlp = 3 * width * (text.get("intermediate_size") or 0) if not experts_count else 3 * width * (
        experts_count * text.get("moe_intermediate_size", 0) + text.get("shared_expert_intermediate_size", 0))
    router = width * (experts_count + 1) if experts_count else 0
    vocab = text.get("vocab_size") or 0
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    split = (linear * (width * (2 * key_dim + 3 * value_dim + 2 * value_heads) + (2 * key_dim + value_dim) * kernel)
             + (full + mtp) * 3 * width * heads * head_dim + (linear + full + mtp) * mlp + (0 if tied else vocab * width))
    whole = vocab * width + (linear + full + mtp) * router + mtp * 2 * width * width
    total = split + whole + (full + mtp) * 2 * kv * head_dim * width
    per_rank = split / size + whole + (full + mtp) * 2 * kept * head_dim * width
    rank_text = dict(text, num_key_value_heads=kept, linear_num_key_heads=dims.key_heads // size,
                     linear_num_value_heads=value_heads // size)
    whole_cache = kv_cache_bytes(text, context, sliding_slack) or 0
    rank_cache = kv_cache_bytes(rank_text, context, sliding_slack) or 0
    return per_rank / total, (rank_cache / whole_cache if whole_cache else 1.0)
