"""Gemma 4's vision tower in MLX (E2B, E4B, 26B-A4B, 31B), as transformers'
`Gemma4VisionModel` followed by the multimodal embedder `embed_vision`.

One image's patches ([N, 3 · patch²] in [0, 1], row by row, as the image processor gives them)
are projected and given a learned position per axis, go through a bidirectional transformer whose
attention rotates each half of a head by one axis of the patch's position (axial 2-D RoPE, with
RMS-normed queries, keys and values and a scale of 1), are averaged over k x k blocks of patches
(k = `pooling_kernel_size`: one soft token per block), scaled by sqrt(width), optionally
standardised, RMS-normed without a scale and projected to the text model's width.

Parameter names are transformers' (`patch_embedder.*`, `encoder.layers.N.*`, `std_bias`,
`std_scale`; the embedder's `embedding_projection`), which mlx-vlm's conversions keep too.
"""

import math
from typing import Tuple

import mlx.core as mx
import mlx.nn as nn

from .layers import ClippableLinear, RMSNorm, rms_norm


def axial_rope(x: mx.array, positions: mx.array, theta: float) -> mx.array:
    """x [N, heads, D]: the first half of each head rotated by the patches' x, the second by
    their y, each half as rotate-half RoPE with frequencies theta^(-2i / (D/2))."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (mx.arange(0, half, 2, dtype=mx.float32) / half))
    parts = []
    for axis in range(2):
        angles = positions[:, axis:axis + 1].astype(mx.float32) * inv_freq  # [N, half / 2]
        angles = mx.concatenate([angles, angles], axis=-1)[:, None, :]
        cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
        part = x[..., axis * half:(axis + 1) * half]
        rotated = mx.concatenate([-part[..., half // 2:], part[..., : half // 2]], axis=-1)
        parts.append(part * cos + rotated * sin)
    return mx.concatenate(parts, axis=-1)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        width, clipped = c["hidden_size"], c["use_clipped_linears"]
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.theta, self.eps = c["rope_theta"], c["rms_norm_eps"]
        self.q_proj = ClippableLinear(width, self.heads * self.head_dim, clipped)
        self.k_proj = ClippableLinear(width, self.kv_heads * self.head_dim, clipped)
        self.v_proj = ClippableLinear(width, self.kv_heads * self.head_dim, clipped)
        self.o_proj = ClippableLinear(self.heads * self.head_dim, width, clipped)
        self.q_norm = RMSNorm(self.head_dim, self.eps)
        self.k_norm = RMSNorm(self.head_dim, self.eps)

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        n = x.shape[0]
        q = axial_rope(self.q_norm(self.q_proj(x).reshape(n, self.heads, self.head_dim)), positions, self.theta)
        k = axial_rope(self.k_norm(self.k_proj(x).reshape(n, self.kv_heads, self.head_dim)), positions, self.theta)
        v = rms_norm(self.v_proj(x).reshape(n, self.kv_heads, self.head_dim), None, self.eps)
        q, k, v = (t.transpose(1, 0, 2)[None] for t in (q, k, v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)  # every patch sees every patch
        return self.o_proj(out[0].transpose(1, 0, 2).reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        width, inner, clipped = c["hidden_size"], c["intermediate_size"], c["use_clipped_linears"]
        self.gate_proj = ClippableLinear(width, inner, clipped)
        self.up_proj = ClippableLinear(width, inner, clipped)
        self.down_proj = ClippableLinear(inner, width, clipped)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))


class EncoderLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        width, eps = c["hidden_size"], c["rms_norm_eps"]
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(width, eps)
        self.post_attention_layernorm = RMSNorm(width, eps)
        self.pre_feedforward_layernorm = RMSNorm(width, eps)
        self.post_feedforward_layernorm = RMSNorm(width, eps)

    def __call__(self, x: mx.array, positions: mx.array) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), positions))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Encoder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.layers = [EncoderLayer(c) for _ in range(c["num_hidden_layers"])]


class PatchEmbedder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.input_proj = nn.Linear(3 * c["patch_size"] ** 2, c["hidden_size"], bias=False)
        self.position_embedding_table = mx.ones((2, c["position_embedding_size"], c["hidden_size"]))

    def __call__(self, pixels: mx.array, positions: mx.array) -> mx.array:
        dtype = self.input_proj.weight.dtype
        hidden = self.input_proj((2 * (pixels - 0.5)).astype(dtype if mx.issubdtype(dtype, mx.floating) else mx.float32))
        table = self.position_embedding_table
        return hidden + table[0][positions[:, 0]] + table[1][positions[:, 1]]


def vision_config(config: dict) -> dict:
    """The vision config with transformers' defaults filled in."""
    c = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "num_attention_heads": 12,
         "num_key_value_heads": 12, "head_dim": 64, "rms_norm_eps": 1e-6, "pooling_kernel_size": 3, "patch_size": 16,
         "position_embedding_size": 10 * 1024, "use_clipped_linears": False, "standardize": False,
         "hidden_activation": "gelu_pytorch_tanh", **config}
    if c["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"vision hidden_activation {c['hidden_activation']!r} is not Gemma 4's")
    rope = c.get("rope_parameters") or {}
    c["rope_theta"] = rope.get("rope_theta", c.get("rope_theta", 100.0))
    return c


class VisionTower(nn.Module):
    """`Gemma4VisionModel`: patches [N, 3 · p²] and their (x, y) [N, 2] -> [N / k², width]."""

    def __init__(self, config: dict):
        super().__init__()
        c = self.c = vision_config(config)
        self.patch_embedder = PatchEmbedder(c)
        self.encoder = Encoder(c)
        if c["standardize"]:
            self.std_bias, self.std_scale = mx.zeros((c["hidden_size"],)), mx.ones((c["hidden_size"],))

    def __call__(self, pixels: mx.array, positions: mx.array, grid: Tuple[int, int]) -> mx.array:
        """`grid`: the image's (rows, columns) of patches, which `positions` cover row by row."""
        x = self.patch_embedder(pixels, positions)
        for layer in self.encoder.layers:
            x = layer(x, positions)
        pooled = self.pool(x.astype(mx.float32), grid).astype(x.dtype).astype(mx.float32)
        pooled = pooled * math.sqrt(self.c["hidden_size"])  # in float32: it may pass float16's range
        if self.c["standardize"]:
            pooled = (pooled - self.std_bias.astype(mx.float32)) * self.std_scale.astype(mx.float32)
        return pooled.astype(x.dtype)

    def pool(self, x: mx.array, grid: Tuple[int, int]) -> mx.array:
        """The mean of each k x k block of patches, blocks in row-major order (transformers'
        kernel index x // k + (columns / k) · (y // k)); the image processor makes both sides
        multiples of k."""
        k, (rows, cols) = self.c["pooling_kernel_size"], map(int, grid)
        if rows * cols != x.shape[0] or rows % k or cols % k:
            raise ValueError(f"{x.shape[0]} patches do not form a {rows} x {cols} grid of {k} x {k} blocks")
        blocks = x.reshape(rows // k, k, cols // k, k, -1).mean(axis=(1, 3))
        return blocks.reshape(rows * cols // (k * k), -1)
