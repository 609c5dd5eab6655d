"""Qwen3.5 / Qwen3.6 with random weights in a published size's shapes (`bench --random-weights
--shape qwen3.6-27b`): mlx-lm's network with its MTP layer, quantized to 4 bits as mlx-community's
conversions are (the MTP layer stays bfloat16, as the split `*-MTP-bf16` folders hold it), built
layer by layer so memory stays near the final size."""

import copy

import mlx.core as mx
import mlx.nn as nn

from ..engine import Engine
from ..decoding.lockstep import Lockstep
from ..models.qwen3_5 import FAMILY
from ..models.qwen3_5.drafter import MTPDraft
from ..models.qwen3_5.mtp import MTPLayer
from ..models.qwen3_5.shapes import SHAPES
from ..models.qwen3_5.target import Target
from .random_tables import random_embedding, settle

GROUP_SIZE = 64
ROUTERS_BITS = 8  # as mlx-lm converts a Qwen3.5 mixture (its quant_predicate)


def random_qwen(name: str, bits=4, group=None) -> Engine:
    """A random Qwen pair of shape `name` (models/qwen3_5/shapes.py); `group`: split over it."""
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    text = copy.deepcopy(SHAPES[name])  # (mlx-lm's arguments take its dicts as they are)
    module = qwen3_5_moe if "moe" in text["model_type"] else qwen3_5
    model = module.Model(module.ModelArgs.from_dict({"model_type": text["model_type"].replace("_text", ""),
                                                     "text_config": text}))  # lazy: nothing allocated yet
    lm, args = model.language_model, model.language_model.args
    lm.model.embed_tokens = random_embedding(args.vocab_size, args.hidden_size, bits, GROUP_SIZE)
    for layer in lm.model.layers:
        settle(layer, bits, GROUP_SIZE, ROUTERS_BITS)
    settle(lm.model.norm, bits, GROUP_SIZE)
    if not args.tie_word_embeddings:  # (made in row chunks, as the embedding: never whole in float32)
        lm.lm_head = quantized_head(args.vocab_size, args.hidden_size, bits)
    model.eval()
    layer = MTPLayer(qwen3_5.TextModelArgs.from_dict(text))
    settle(layer, None, GROUP_SIZE)
    if text.get("num_experts") and not mx.metal.is_available():  # MLX's CPU gathers experts in float32 only
        layer.set_dtype(mx.float32)
        mx.eval(layer.parameters())
    target, draft = Target(model), MTPDraft(layer)
    if group is not None:
        FAMILY.split(target, draft, group)
    FAMILY.join(target, draft)
    return Engine.of(target, draft, family=FAMILY, lockstep=Lockstep(group) if group is not None else None)


def quantized_head(vocab: int, hidden: int, bits) -> nn.Module:
    """A random LM head: the embedding's table as a linear layer (the same layout)."""
    table = random_embedding(vocab, hidden, bits, GROUP_SIZE)
    if not bits:
        head = nn.Linear(hidden, vocab, bias=False)
        head.weight = table.weight
        return head
    head = nn.QuantizedLinear(hidden, vocab, bias=False, group_size=GROUP_SIZE, bits=bits)
    head.weight, head.scales, head.biases = table.weight, table.scales, table.biases
    return head
