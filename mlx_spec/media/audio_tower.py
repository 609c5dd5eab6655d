"""Gemma 4's audio tower (E2B, E4B) in MLX: log-mel frames to the text model's soft tokens.

Equal to transformers' `Gemma4AudioModel` (a USM-style conformer) followed by
`Gemma4MultimodalEmbedder` (`embed_audio`), keeping the tokens the tower's output mask marks
valid, as `Gemma4Model` does before scattering them into the prompt. The conformer: two stride-2
3x3 convolutions over (time, mel), each with a bias-free LayerNorm and ReLU, and a projection;
then layers of a half-step feed-forward, chunked local self-attention with Transformer-XL
relative positions, a causal depthwise convolution and another half-step feed-forward; then an
output projection. The embedder is an RMS norm without scale and a projection.

Weights load from google's layout with `audio_tower_weights`: `model.audio_tower.X` as
`tower.X`, `model.embed_audio.Y` as `embedder.Y`, convolution kernels moved to MLX's
channels-last layout. As in transformers, it computes in its weights' dtype (float32 weights,
float32 compute), with norms and the attention in float32.
"""

from typing import Any, Dict, Mapping, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import AudioWeightsError
from .audio_attention import ChunkedAttention, attention_mask, clamp, relative_positions
from .audio_config import AudioConfig
from .layers import ClippableLinear, MultimodalEmbedder, RMSNorm

TOWER, EMBEDDER = "model.audio_tower.", "model.embed_audio."
CONV_WEIGHTS = (".conv.weight", ".depthwise_conv1d.weight")
CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
ACTIVATIONS = {"silu": nn.silu, "swish": nn.silu, "gelu": nn.gelu, "gelu_pytorch_tanh": nn.gelu_approx, "relu": nn.relu}
DEFAULT_NORM_EPS = 1e-6  # Gemma4RMSNorm's own default, which some of the tower's norms keep




class ConvBlock(nn.Module):
    """A 3x3 stride-2 convolution over (time, mel), a bias-free LayerNorm over channels, ReLU."""

    def __init__(self, channels_in: int, channels_out: int, eps: float):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(channels_out, eps=eps, bias=False)

    def __call__(self, x: mx.array, valid: mx.array) -> Tuple[mx.array, mx.array]:
        # Padded frames are zeroed before each convolution: the valid outputs see only the clip.
        x = x * valid[:, :, None, None].astype(x.dtype)
        x = nn.relu(self.norm(self.conv(x.astype(self.conv.weight.dtype))))
        return x, valid[:, ::2]


class SubsampleProjection(nn.Module):
    """Mel frames [B, T, 128] to [B, ceil(T / 4), hidden], and their validity."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        first, second = config.subsampling_conv_channels
        self.layer0 = ConvBlock(1, first, config.rms_norm_eps)
        self.layer1 = ConvBlock(first, second, config.rms_norm_eps)
        # Sized from the first conv's channels as transformers does: that equals the 128 mel
        # bands / 4 only when those channels are 128 (every released checkpoint).
        self.input_proj_linear = nn.Linear(first // 4 * second, config.hidden_size, bias=False)

    def __call__(self, features: mx.array, valid: mx.array) -> Tuple[mx.array, mx.array]:
        x, valid = self.layer0(features[..., None], valid)
        x, valid = self.layer1(x, valid)
        return self.input_proj_linear(x.reshape(*x.shape[:2], -1)), valid  # (mel, channel) order


class FeedForward(nn.Module):
    """The conformer's half-step feed-forward: norm, 4x expansion, norm, residual at half weight."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        width, clipped = config.hidden_size, config.use_clipped_linears
        self.ffw_layer_1 = ClippableLinear(width, 4 * width, clipped)
        self.ffw_layer_2 = ClippableLinear(4 * width, width, clipped)
        self.pre_layer_norm = RMSNorm(width, DEFAULT_NORM_EPS)
        self.post_layer_norm = RMSNorm(width, DEFAULT_NORM_EPS)
        self.act = ACTIVATIONS[config.hidden_act]
        self.limit, self.weight = config.gradient_clipping, config.residual_weight

    def __call__(self, x: mx.array) -> mx.array:
        y = self.ffw_layer_2(self.act(self.ffw_layer_1(self.pre_layer_norm(clamp(x, self.limit)))))
        return x + self.post_layer_norm(clamp(y, self.limit)) * self.weight


class LightConv(nn.Module):
    """Norm, GLU, a causal depthwise convolution over time, norm, activation, projection, residual."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        width, clipped, eps = config.hidden_size, config.use_clipped_linears, config.rms_norm_eps
        self.linear_start = ClippableLinear(width, 2 * width, clipped)
        self.linear_end = ClippableLinear(width, width, clipped)
        self.depthwise_conv1d = nn.Conv1d(width, width, config.conv_kernel_size, groups=width, bias=False)
        self.pre_layer_norm, self.conv_norm = RMSNorm(width, eps), RMSNorm(width, eps)
        self.act, self.limit = ACTIVATIONS[config.hidden_act], config.gradient_clipping
        self.history = config.conv_kernel_size - 1

    def __call__(self, x: mx.array) -> mx.array:
        y = nn.glu(self.linear_start(self.pre_layer_norm(x)), axis=-1)
        y = self.depthwise_conv1d(mx.pad(y, [(0, 0), (self.history, 0), (0, 0)]))  # causal
        return x + self.linear_end(self.act(self.conv_norm(clamp(y, self.limit))))


class ConformerLayer(nn.Module):
    def __init__(self, config: AudioConfig):
        super().__init__()
        self.feed_forward1, self.feed_forward2 = FeedForward(config), FeedForward(config)
        self.self_attn = ChunkedAttention(config)
        self.lconv1d = LightConv(config)
        self.norm_pre_attn = RMSNorm(config.hidden_size, DEFAULT_NORM_EPS)
        self.norm_post_attn = RMSNorm(config.hidden_size, DEFAULT_NORM_EPS)
        self.norm_out = RMSNorm(config.hidden_size, DEFAULT_NORM_EPS)
        self.limit = config.gradient_clipping

    def __call__(self, x: mx.array, allowed: mx.array, positions: mx.array) -> mx.array:
        x = self.feed_forward1(x)
        attended = self.self_attn(self.norm_pre_attn(clamp(x, self.limit)), allowed, positions)
        x = x + self.norm_post_attn(clamp(attended, self.limit))
        x = self.feed_forward2(self.lconv1d(x))
        return self.norm_out(clamp(x, self.limit))


class Conformer(nn.Module):
    """`Gemma4AudioModel`: mel frames [B, T, 128] and their mask to hidden states
    [B, ceil(T / 4), output_proj_dims] and the mask of the valid ones (every 4th frame's)."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        self.config = config
        self.subsample_conv_projection = SubsampleProjection(config)
        self.layers = [ConformerLayer(config) for _ in range(config.num_hidden_layers)]
        self.output_proj = nn.Linear(config.hidden_size, config.output_proj_dims, bias=True)
        self._positions = relative_positions(config)  # computed, never in a checkpoint

    def __call__(self, features: mx.array, valid: mx.array) -> Tuple[mx.array, mx.array]:
        x, valid = self.subsample_conv_projection(features, valid)
        allowed, positions = attention_mask(valid, self.config), self._positions.astype(x.dtype)
        for layer in self.layers:
            x = layer(x, allowed, positions)
        return self.output_proj(x), valid


def soft_tokens(conformer: Conformer, embedder: MultimodalEmbedder, features, mask) -> mx.array:
    """One clip's features [frames, 128] and mask [frames] to its soft tokens [tokens, text hidden]."""
    hidden, valid = conformer(mx.array(features)[None], mx.array(mask)[None])
    # Tokens from the padding past the clip's end are dropped, as transformers does.
    keep = mx.array(np.flatnonzero(np.array(valid[0])))
    return embedder(hidden[0][keep])


def to_module_layout(weights: Mapping[str, mx.array], wanted: Mapping[str, mx.array]) -> Dict[str, mx.array]:
    """Convolution kernels in PyTorch's layout (google's checkpoints) moved to MLX's, and clip
    bounds stored as one-element arrays made scalars; kernels already in MLX's layout (mlx-vlm's
    conversions) are kept. `wanted`: the module's parameters."""
    moved = dict(weights)
    for name, value in weights.items():
        if name not in wanted or value.shape == wanted[name].shape:
            continue
        if name.endswith(CONV_WEIGHTS):
            moved[name] = mx.moveaxis(value, 1, -1)
        elif name.endswith(CLIP_BOUNDS) and value.size == 1:
            moved[name] = value.reshape(wanted[name].shape)
    return moved


class AudioTower(nn.Module):
    """One clip's mel features [frames, 128] and mask [frames] (as `audio_features` makes them)
    to its soft tokens' embeddings [tokens, text hidden], the rows `Gemma4Model` puts in the prompt."""

    def __init__(self, audio_config: Mapping[str, Any], text_hidden_size: int):
        super().__init__()
        config = AudioConfig.from_dict(audio_config)
        self.tower = Conformer(config)
        self.embedder = MultimodalEmbedder(config.output_proj_dims, text_hidden_size, config.rms_norm_eps)

    def __call__(self, features, mask) -> mx.array:
        return soft_tokens(self.tower, self.embedder, features, mask)

    def load_checkpoint(self, weights: Mapping[str, Any]) -> None:
        """Google's weights (keys `model.audio_tower.*` and `model.embed_audio.*`; others are
        ignored): every one this config needs, in its shape, or `AudioWeightsError` naming them."""
        given, wanted = audio_tower_weights(weights), dict(tree_flatten(self.parameters()))
        problems = [("lacks", sorted(wanted.keys() - given.keys())),
                    ("has weights this audio config does not use:", sorted(given.keys() - wanted.keys()))]
        for what, names in problems:
            if names:
                raise AudioWeightsError(f"the audio tower checkpoint {what} {_listing(names)}")
        wrong = [f"{checkpoint_key(k)} {tuple(v.shape)} (expected {tuple(wanted[k].shape)})"
                 for k, v in given.items() if v.shape != wanted[k].shape]
        if wrong:
            raise AudioWeightsError(f"the audio tower checkpoint has weights of the wrong shape: {'; '.join(wrong)}")
        self.update(tree_unflatten(list(given.items())))
        mx.eval(self.parameters())


def audio_tower_weights(weights: Mapping[str, Any]) -> Dict[str, mx.array]:
    """Google's `model.audio_tower.X` as `tower.X` and `model.embed_audio.Y` as `embedder.Y`
    (numpy or MLX arrays; other keys are left out), convolution kernels moved from PyTorch's
    (out, in, k[, k]) to MLX's (out, k[, k], in)."""
    mapped = {}
    for key, value in weights.items():
        if key.startswith(TOWER):
            name = "tower." + key[len(TOWER):]
        elif key.startswith(EMBEDDER):
            name = "embedder." + key[len(EMBEDDER):]
        else:
            continue
        value = mx.array(value) if not isinstance(value, mx.array) else value
        mapped[name] = mx.moveaxis(value, 1, -1) if name.endswith(CONV_WEIGHTS) else value
    return mapped


def checkpoint_key(name: str) -> str:
    """The checkpoint key of one of `AudioTower`'s parameters."""
    prefix, rest = name.split(".", 1)
    return {"tower": TOWER, "embedder": EMBEDDER}[prefix] + rest


def _listing(names: Sequence[str], shown: int = 5) -> str:
    keys = [checkpoint_key(n) for n in names[:shown]]
    return ", ".join(keys) + (f" and {len(names) - shown} more" if len(names) > shown else "")
