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
from typing import List

import mlx.core as mx

from ...errors import LoadError
from .loader import text_config


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
