"""Gemma 4 split tensor-parallel over a group of processes (mlx.core.distributed), in place.

Megatron's split, as vLLM and mlx-lm's sharded models do it, on mlx-lm's own layers:
- attention: each rank computes its share of the query heads (q_proj's rows), attends with the
  K/V heads those queries read, and its share of o_proj's columns, summed over the group;
- K/V heads: split where the group divides them; where it does not (E2B and E4B's sliding
  layers have one or two), each rank keeps the one K/V head its query heads read, computed
  alike on the ranks that share it (vLLM's replication);
- the dense MLP: gate and up split by rows, down by columns, summed over the group;
- the per-layer inputs stay whole on every rank; the MoE block (26B-A4B) too by default, or, by
  choice (`experts="split"`), its experts are divided between the ranks: each rank holds a
  share of them whole (quantized ones as they are: a 4-bit expert's width does not split into
  whole quantization groups), weighs the tokens routed to them, and the group sums (one more
  all-reduce per layer, for half the memory of the experts on two ranks).

Two all-reduces per layer, of the hidden state alone. Quantized linears split as they are
(mlx.nn's sharded quantized layers), never dequantized.

The MTP drafter attends to the target's K/V: where every rank keeps all of it (one K/V head),
the drafter stays whole on every rank; where the K/V heads are split, its attention is split
the same way (its query heads read the K/V heads this rank keeps), so it never gathers a cache.
Every rank so drafts the same guesses, from the same hidden states (an all-reduce gives every
rank the same sum).
"""

from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_linear

from ...errors import LoadError
from .facts import FULL, SLIDING, head_dims, kv_cache_bytes, kv_heads, normalize_text_config, text_config


EXPERTS = ("whole", "split")  # the MoE's experts on every rank, or divided between them


def split_problems(config: dict, size: int, experts: str = "whole") -> List[str]:
    """Why a target of this config.json cannot be split over `size` ranks (none: it can)."""
    text = normalize_text_config(text_config(config))
    problems = []
    if experts not in EXPERTS:
        problems.append(f"its experts as {experts!r} (one of {', '.join(EXPERTS)})")
    elif experts == "split" and text.get("enable_moe_block") and (text.get("num_experts") or 0) % size:
        problems.append(f"its {text.get('num_experts')} experts")
    heads = text.get("num_attention_heads") or 0
    if heads % size:
        problems.append(f"its {heads} query heads")
    for kind, n in kv_heads(text).items():
        if n % size and size % n:
            problems.append(f"the {n} K/V heads of its {kind} layers (neither divides the other)")
    width = text.get("intermediate_size") or 0  # (double-wide layers are twice it)
    if width % size:
        problems.append(f"its MLP width {width}")
    group = quantization_group(config)
    if group and not width % size and (width // size) % group:
        # down_proj is cut along its input, which a quantized weight packs in groups
        problems.append(f"its MLP width {width} in whole quantization groups of {group}")
    return problems


def quantization_group(config: dict) -> int:
    """The group size of a quantized checkpoint's weights (0: not quantized)."""
    quantization = config.get("quantization") or config.get("quantization_config") or {}
    return int(quantization.get("group_size") or 0) if isinstance(quantization, dict) else 0


def check_split(config: dict, size: int, path, experts: str = "whole") -> None:
    """A LoadError, before any weight is read, where `size` ranks cannot split this target."""
    if experts == "split" and not normalize_text_config(text_config(config)).get("enable_moe_block"):
        raise LoadError(f"target {path} has no experts to split: experts=\"split\" (--experts split) is for a "
                        "mixture of experts, such as 26b-a4b")
    problems = split_problems(config, size, experts)
    if problems:
        raise LoadError(f"target {path}: a group of {size} cannot split " + ", ".join(problems) +
                        " evenly; run it on a group whose size divides them (1 runs it whole)")


def split_target(target, group: mx.distributed.Group, experts: str = "whole") -> None:
    """Split the target's layers over `group`, in place (see the module's docstring)."""
    rank, size = group.rank(), group.size()
    for layer in target.text_model.layers:
        _split_attention(layer.self_attn, rank, size, group)
        if experts == "split" and getattr(layer, "enable_moe", False):
            layer.experts = SplitExperts(layer.experts, rank, size, group)
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "gate_proj"):
            mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
            mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
            mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)


class SplitExperts(nn.Module):
    """The MoE's experts divided between the ranks: this rank's share, whole. A token's k
    chosen experts are weighed where they are held (elsewhere their weight is zero), and the
    group's all-reduce sums the shares: every rank gets the whole layer's output."""

    def __init__(self, experts: nn.Module, rank: int, size: int, group):
        super().__init__()
        glu = experts.switch_glu
        self.count = glu.gate_proj.weight.shape[0] // size
        self.first = rank * self.count
        for linear in (glu.gate_proj, glu.up_proj, glu.down_proj):
            for name in ("weight", "scales", "biases", "bias"):
                if name in linear:
                    linear[name] = linear[name][self.first:self.first + self.count]
        self.switch_glu, self.group = glu, group

    def __call__(self, x: mx.array, top_k_indices: mx.array, top_k_weights: mx.array) -> mx.array:
        local = top_k_indices - self.first
        held = (local >= 0) & (local < self.count)
        y = self.switch_glu(x, mx.where(held, local, 0))
        weights = mx.expand_dims(mx.where(held, top_k_weights, 0), -1)
        return mx.distributed.all_sum((weights * y).sum(-2), group=self.group)


def kv_is_split(target, size: int) -> bool:
    """Whether a rank of a group of `size` keeps only some of the target's K/V heads."""
    return size > 1 and any(n > 1 for n in kv_heads(target.args).values())


def check_drafter_split(target_config: dict, drafter_config: dict, size: int, path) -> None:
    """A LoadError, before the drafter's weights are read, where its attention cannot be split
    as the target's K/V heads are over `size` ranks (nothing is split where each rank keeps
    every K/V head)."""
    target_kv = kv_heads(normalize_text_config(text_config(target_config)))
    if size <= 1 or not any(n > 1 for n in target_kv.values()):
        return
    heads = text_config(drafter_config).get("num_attention_heads") or 0
    if heads % size:
        raise LoadError(_unsplittable(f"drafter {path}: its", heads, size))


def _unsplittable(whose: str, heads: int, size: int) -> str:
    return (f"{whose} {heads} query heads cannot be split over a group of {size} (the target's K/V "
            "heads are split, and its attention reads them): run on a group whose size divides them, or without "
            "the drafter (--no-mtp)")


def split_drafter(drafter, target, group: mx.distributed.Group) -> None:
    """Split the drafter's attention as the target's K/V heads are split (nothing to do where
    every rank keeps all of them); its MLP and heads stay whole. (`check_drafter_split` refuses
    a drafter that cannot be, from the configs, before it is loaded.)"""
    if not kv_is_split(target, group.size()):
        return
    query_heads = {layer.self_attn.n_heads for layer in drafter.model.layers}
    if any(n % group.size() for n in query_heads):
        raise LoadError(_unsplittable("the drafter's", min(query_heads), group.size()))
    heads = kv_heads(target.args)
    for layer, kind in zip(drafter.model.layers, drafter.layer_types):
        _split_attention(layer.self_attn, group.rank(), group.size(), group, kv=heads[kind])


def _split_attention(attn, rank: int, size: int, group, kv: Optional[int] = None) -> None:
    """This rank's query heads (q_proj's rows, o_proj's columns) and the K/V heads they read.
    `kv`: the K/V heads of a layer that reads another's (the drafter's)."""
    n_kv = kv or attn.n_kv_heads
    first, count = kv_heads_of(rank, size, n_kv)
    attn.q_proj = shard_linear(attn.q_proj, "all-to-sharded", group=group)
    attn.o_proj = shard_linear(attn.o_proj, "sharded-to-all", group=group)
    attn.n_heads //= size
    for name in ("k_proj", "v_proj"):
        if hasattr(attn, name):
            setattr(attn, name, _rows(getattr(attn, name), first * attn.head_dim, count * attn.head_dim))
    if hasattr(attn, "n_kv_heads"):
        attn.n_kv_heads = count


def kv_heads_of(rank: int, size: int, heads: int) -> Tuple[int, int]:
    """(first, count): the K/V heads rank `rank` of `size` keeps of `heads`: an even share where
    the group divides them, else the one its query heads read (ranks share it)."""
    if heads % size == 0:
        return rank * heads // size, heads // size
    return rank * heads // size, 1


def _rows(linear: nn.Module, start: int, count: int) -> nn.Module:
    """The linear with only output rows [start, start + count) (quantized ones as they are: a
    quantized weight packs its input dimension, so rows are whole)."""
    if count == linear.weight.shape[0]:
        return linear
    for name in ("weight", "scales", "biases", "bias"):
        if name in linear:
            linear[name] = linear[name][start:start + count]
    return linear


def split_pair(target, drafter, group: mx.distributed.Group, experts: str = "whole") -> None:
    """The family's `split`: the target, and the drafter beside it (None: no drafter)."""
    split_target(target, group, experts)
    if drafter is not None:
        split_drafter(drafter, target, group)


def rank_share(config: dict, size: int, experts: str = "whole", context: int = 8192,
               sliding_slack: int = 0) -> Tuple[float, float]:
    """(weights, K/V cache): the share of the whole that one rank of `size` holds. Weights, from
    the config's parameters: the split ones (query and output heads, the dense MLP, the MoE's
    experts when `experts` is "split") over the group, the K/V projections by the heads a rank
    keeps, the rest (embeddings, per-layer inputs) whole. The cache at `context` tokens as the
    family counts it (`kv_cache_bytes`: a window on sliding layers, the context on full ones),
    with the K/V heads a rank keeps: a head the ranks share is whole on each. The memory check
    scales the files and the cache by them."""
    text = normalize_text_config(text_config(config))
    width, layers = text["hidden_size"], text["num_hidden_layers"]
    heads, kinds = text["num_attention_heads"], text.get("layer_types") or []
    dims, kv = head_dims(text), kv_heads(text)
    shared_from = layers - (text.get("num_kv_shared_layers") or 0)
    kept = {kind: kv_heads_of(0, size, n)[1] for kind, n in kv.items()}
    total = per_rank = (text.get("vocab_size") or 0) * width + (text.get("vocab_size_per_layer_input") or 0) * layers * (
        text.get("hidden_size_per_layer_input") or 0)
    for i, kind in enumerate(kinds[:layers]):
        split = 2 * heads * dims[kind] * width + 3 * width * (text.get("intermediate_size") or 0) * (
            2 if text.get("use_double_wide_mlp") and i >= shared_from > 0 else 1)
        total, per_rank = total + split, per_rank + split / size
        if i < shared_from:
            per_head = dims[kind] * width * (1 if kind == FULL and text.get("attention_k_eq_v") else 2)
            total, per_rank = total + kv[kind] * per_head, per_rank + kept[kind] * per_head
        if text.get("enable_moe_block"):
            expert_params = (text.get("num_experts") or 0) * 3 * width * (text.get("moe_intermediate_size") or 0)
            total, per_rank = total + expert_params, per_rank + expert_params / (size if experts == "split" else 1)
    whole_cache = kv_cache_bytes(text, context, sliding_slack) or 0
    rank_text = dict(text, num_key_value_heads=kept[SLIDING])
    if text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
        rank_text["num_global_key_value_heads"] = kept[FULL]
    rank_cache = kv_cache_bytes(rank_text, context, sliding_slack) or 0
    return (per_rank / total if total else 1.0), (rank_cache / whole_cache if whole_cache else 1.0)
