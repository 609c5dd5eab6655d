"""The layers Gemma 4's media encoders share, as transformers writes them: its RMS norm (in
float32, the weight multiplying, no 1 + weight), the linear layer whose input and output may be
clamped to bounds read from the checkpoint, and the embedder into the text model's width."""

import math

import mlx.core as mx
import mlx.nn as nn


def rms_norm(x: mx.array, weight, eps: float) -> mx.array:
    """In float32, back in the input's dtype; `weight` None: no scale."""
    x32 = x.astype(mx.float32)
    out = x32 * mx.rsqrt(mx.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight is not None:
        out = out * weight.astype(mx.float32)
    return out.astype(x.dtype)


class RMSNorm(nn.Module):
    """`Gemma4RMSNorm`."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = mx.ones((width,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self.weight, self.eps)


class ClippableLinear(nn.Module):
    """A bias-free linear whose input and output are clamped to scalar bounds from the checkpoint
    (when the config turns clipping on; the bounds are then parameters, loaded with the rest)."""

    def __init__(self, inputs: int, outputs: int, clipped: bool):
        super().__init__()
        self.linear = nn.Linear(inputs, outputs, bias=False)
        self.clipped = clipped
        if clipped:
            self.input_min, self.input_max = mx.array(-math.inf), mx.array(math.inf)
            self.output_min, self.output_max = mx.array(-math.inf), mx.array(math.inf)

    def __call__(self, x: mx.array) -> mx.array:
        if not self.clipped:
            return self.linear(x)
        # The bounds in the input's dtype: a float32 bound must not promote a bfloat16 activation.
        x = self.linear(mx.clip(x, self.input_min.astype(x.dtype), self.input_max.astype(x.dtype)))
        return mx.clip(x, self.output_min.astype(x.dtype), self.output_max.astype(x.dtype))


class MultimodalEmbedder(nn.Module):
    """`Gemma4MultimodalEmbedder`: an RMS norm without a scale, then a projection to the text
    model's width."""

    def __init__(self, width: int, text_width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.embedding_projection = nn.Linear(width, text_width, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(rms_norm(x, None, self.eps))
