"""The pieces of the benchmarks' random-weight models (models.py's Gemma 4, random_qwen.py's
Qwen3.5): embedding tables made in row chunks (a 262k-row vocabulary is never whole in float32),
and each module cast, quantized and materialised as it is built."""

from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn


def random_embedding(rows: int, dims: int, bits, group_size: int, chunk: int = 8192) -> nn.Module:
    """A random (quantized) embedding table made in row chunks."""
    if not bits:
        embedding = nn.Embedding(rows, dims)
        embedding.weight = (mx.random.normal((rows, dims)) * 0.02).astype(mx.bfloat16)
        mx.eval(embedding.weight)
        return embedding
    parts = []
    for start in range(0, rows, chunk):
        w = (mx.random.normal((min(chunk, rows - start), dims)) * 0.02).astype(mx.bfloat16)
        parts.append(mx.quantize(w, group_size=group_size, bits=bits))
        mx.eval(parts[-1])
    embedding = nn.QuantizedEmbedding(rows, dims, group_size=group_size, bits=bits)
    embedding.weight, embedding.scales, embedding.biases = (mx.concatenate([p[i] for p in parts]) for i in range(3))
    mx.eval(embedding.parameters())
    return embedding


def settle(module: nn.Module, bits, group_size: int, routers_bits: Optional[int] = None) -> None:
    """Cast to bfloat16, quantize if asked, and materialise this piece now. `routers_bits`: a
    mixture's routers (`mlp.gate`, `shared_expert_gate`) at these bits, as mlx-lm converts
    Qwen3.5 (its `quant_predicate`)."""
    module.set_dtype(mx.bfloat16)
    if bits:
        nn.quantize(module, group_size=group_size, bits=bits, class_predicate=_quantized_as(group_size, routers_bits))
    mx.eval(module.parameters())


def _quantized_as(group_size: int, routers_bits: Optional[int]) -> Callable:
    def predicate(path: str, module: nn.Module):
        # Linear layers and the experts' stacked ones (SwitchLinear), as mlx-lm's conversions do.
        if not hasattr(module, "to_quantized") or isinstance(module, nn.Embedding) or module.weight.shape[-1] % group_size:
            return False
        if routers_bits and (path.endswith("mlp.gate") or path.endswith("shared_expert_gate")):
            return {"group_size": group_size, "bits": routers_bits}
        return True

    return predicate
