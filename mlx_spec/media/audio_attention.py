"""The audio tower's self-attention: chunked local attention with Transformer-XL relative
positions, as transformers' `Gemma4AudioAttention` computes it (a chunk of queries sees its
chunk, `attention_context_left - 1` frames before it and `attention_context_right` after)."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .audio_config import AudioConfig
from .layers import ClippableLinear


def clamp(x: mx.array, limit: float) -> mx.array:
    """transformers' `gradient_clipping` clamp, capped at the dtype's range as it is there."""
    limit = min(limit, float(mx.finfo(x.dtype).max))
    return mx.clip(x, -limit, limit)


def _context_indices(blocks: int, config: AudioConfig) -> mx.array:
    """[blocks, context]: for each chunk of queries, its keys' indices into the sequence padded
    with `past` positions before it."""
    chunk = config.attention_chunk_size
    return mx.arange(blocks)[:, None] * chunk + mx.arange(config.context)[None, :]


def attention_mask(valid: mx.array, config: AudioConfig) -> mx.array:
    """[B, 1, blocks, chunk, context]: where a query may attend a key. As transformers'
    `sliding_window_mask_function((past, future))` with the key padding mask: q - k in
    [0, past) or in (-future, 0), which leaves out the block context's outermost key on each side."""
    chunk, past, future = config.attention_chunk_size, config.past, config.attention_context_right
    blocks = -(-valid.shape[1] // chunk)
    keys = _context_indices(blocks, config)
    queries = mx.arange(blocks)[:, None] * chunk + mx.arange(chunk)[None, :]
    distance = queries[:, :, None] - (keys - past)[:, None, :]
    window = ((distance >= 0) & (distance < past)) | ((distance < 0) & (-distance < future))
    key_valid = mx.pad(valid, [(0, 0), (past, future + chunk - 1)])[:, keys]
    return (window[None] & key_valid[:, :, None, :])[:, None]


def relative_positions(config: AudioConfig) -> mx.array:
    """[context // 2 + 1, hidden]: sinusoids (sin, then cos) of positions context // 2 down to 0."""
    count = config.hidden_size // 2
    step = math.log(10_000.0) / max(count - 1, 1)
    inv_timescales = np.exp(np.arange(count, dtype=np.float32) * np.float32(-step))
    times = np.arange(config.context // 2, -1, -1, dtype=np.float32)[:, None] * inv_timescales[None, :]
    return mx.array(np.concatenate([np.sin(times), np.cos(times)], axis=-1))


class ChunkedAttention(nn.Module):
    """Local self-attention over chunks of queries, each seeing a window of past (and future)
    keys, with a learned per-dimension query scale and relative position logits."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        width, heads, clipped = config.hidden_size, config.num_attention_heads, config.use_clipped_linears
        self.config, self.heads, self.head_dim = config, heads, width // heads
        inner = heads * self.head_dim
        self.q_proj = ClippableLinear(width, inner, clipped)
        self.k_proj = ClippableLinear(width, inner, clipped)
        self.v_proj = ClippableLinear(width, inner, clipped)
        self.post = ClippableLinear(width, width, clipped)
        self.relative_k_proj = nn.Linear(width, inner, bias=False)
        self.per_dim_scale = mx.zeros((self.head_dim,))
        # USM's scales: queries by softplus(per_dim_scale) / sqrt(d), both in log2 units.
        self.q_scale = self.head_dim ** -0.5 / math.log(2)
        self.k_scale = math.log(1 + math.e) / math.log(2)

    def _split(self, projection, x: mx.array) -> mx.array:
        return projection(x).astype(mx.float32).reshape(*x.shape[:2], self.heads, self.head_dim)

    def _chunks(self, x: mx.array, blocks: int) -> mx.array:
        """[B, T, H, d] to [B, H, blocks, chunk, d], zero-padded at the end."""
        chunk = self.config.attention_chunk_size
        x = mx.pad(x, [(0, 0), (0, blocks * chunk - x.shape[1]), (0, 0), (0, 0)])
        return x.reshape(x.shape[0], blocks, chunk, self.heads, self.head_dim).transpose(0, 3, 1, 2, 4)

    def _contexts(self, x: mx.array, blocks: int) -> mx.array:
        """[B, T, H, d] to each chunk's keys [B, H, blocks, context, d], zeros outside the sequence."""
        c = self.config
        x = mx.pad(x, [(0, 0), (c.past, c.attention_context_right + c.attention_chunk_size - 1), (0, 0), (0, 0)])
        return x[:, _context_indices(blocks, c)].transpose(0, 3, 1, 2, 4)

    def _shift(self, x: mx.array) -> mx.array:
        """Transformer-XL's shift (appendix B of arXiv:1901.02860) of [..., chunk, positions]
        logits to [..., chunk, context]: query row i moves right by i, and what passes the end
        of a row wraps into the next one, exactly as transformers pads and reshapes."""
        *lead, chunk, positions = x.shape
        width = self.config.context
        x = mx.pad(x, [(0, 0)] * (len(lead) + 1) + [(0, width + 1 - positions)])
        x = x.reshape(*lead, chunk * (width + 1))[..., : chunk * width]
        return x.reshape(*lead, chunk, width)

    def __call__(self, x: mx.array, allowed: mx.array, positions: mx.array) -> mx.array:
        c, (batch, length, _) = self.config, x.shape
        blocks = allowed.shape[2]
        scale = self.q_scale * nn.softplus(self.per_dim_scale.astype(mx.float32))
        queries = self._chunks(self._split(self.q_proj, x) * scale, blocks)
        keys = self._contexts(self._split(self.k_proj, x) * self.k_scale, blocks)
        values = self._contexts(self._split(self.v_proj, x), blocks)
        relative = self.relative_k_proj(positions).astype(mx.float32)
        relative = relative.reshape(-1, self.heads, self.head_dim).transpose(1, 2, 0)  # [H, d, positions]
        logits = queries @ keys.swapaxes(-1, -2) + self._shift(queries @ relative[:, None])
        logits = mx.tanh(logits / c.attention_logit_cap) * c.attention_logit_cap
        weights = mx.softmax(mx.where(allowed, logits, c.attention_invalid_logits_value), axis=-1)
        out = (weights @ values).transpose(0, 2, 3, 1, 4).reshape(batch, -1, self.heads * self.head_dim)
        return self.post(out[:, :length].astype(x.dtype))
