"""Random embedding tables for the benchmarks' random-weight models (models.py's Gemma 4,
random_qwen.py's Qwen3.5), made in row chunks: a 262k-row vocabulary is never whole in float32."""

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
