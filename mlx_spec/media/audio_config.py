"""The audio tower's config (`audio_config` in a checkpoint), with transformers' defaults."""

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class AudioConfig:
    """A checkpoint's `audio_config`, with transformers' defaults (`Gemma4AudioConfig`)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    hidden_act: str = "silu"
    subsampling_conv_channels: Sequence[int] = (128, 32)
    conv_kernel_size: int = 5
    residual_weight: float = 0.5
    attention_chunk_size: int = 12
    attention_context_left: int = 13
    attention_context_right: int = 0
    attention_logit_cap: float = 50.0
    attention_invalid_logits_value: float = -1.0e9
    use_clipped_linears: bool = True
    rms_norm_eps: float = 1e-6
    gradient_clipping: float = 1e10
    output_proj_dims: int = 1536

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "AudioConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in known and v is not None})

    @property
    def past(self) -> int:
        return self.attention_context_left - 1

    @property
    def context(self) -> int:
        """Keys each chunk of queries sees: the chunk, the past horizon and the future one."""
        return self.attention_chunk_size + self.past + self.attention_context_right
