"""Loading Gemma 4's targets and MTP assistants from checkpoints already read
(models/checkpoint.py), through mlx-lm's loader, and checking that a pair fits together.

Every problem a user can cause is a `LoadError` naming the path and what is wrong.
"""

from pathlib import Path
from typing import Optional

from ...errors import LoadError
from ..checkpoint import Checkpoint, mlx_error
from ..quantize import check_quantization, quantize_drafter
from .assistant import Assistant, AssistantConfig
from .facts import TEXT_TYPES, head_dims, kv_heads, kv_source_layers, normalize_text_config, text_config
from .sizes import SIZES, size_of
from .target import Target

# The multimodal wrappers as google ships them and their text models alone; the 12B
# (`gemma4_unified*`) has the same text network and assistant as the other sizes.
TARGET_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
DRAFTER_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")


def target_from(ckpt: Checkpoint) -> Target:
    """The target of a Gemma 4 checkpoint: mlx-lm's model with the config as transformers reads it."""
    from mlx_lm.utils import load_model

    text = normalize_text_config(text_config(ckpt.config))
    if text.get("use_bidirectional_attention") == "all":
        raise LoadError(f"target {ckpt.path}: use_bidirectional_attention is \"all\" (every token attends both "
                        "ways): not a causal language model, nothing to decode with")
    try:
        kv_source_layers(text)  # (mlx-lm would fail on it with a bare KeyError)
    except ValueError as e:
        raise LoadError(f"target {ckpt.path}: {e}") from None
    if ckpt.config["model_type"] in TEXT_TYPES:
        overrides = text
    else:
        # mlx-lm's wrapper copies its own top-level vocab_size (default 262144) into the text config.
        overrides = {"text_config": text, "vocab_size": text.get("vocab_size", 262144)}
    try:
        # Lazy: the weights are read when evaluated (loading.py), so that a rank of a group reads
        # only its own shard of them (tensor_parallel.py).
        model, _ = load_model(ckpt.path, lazy=True, model_config=overrides, get_model_classes=_target_classes)
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise mlx_error("target", ckpt.path, e) from None
    return Target(model, images_attend_both_ways=text.get("use_bidirectional_attention") == "vision")


def _target_classes(config: dict):
    """mlx-lm's Gemma 4 classes for every target type: its text model for a text checkpoint, its
    multimodal wrapper (which drops the media weights) for google's and the MLX conversions'."""
    from mlx_lm.models import gemma4, gemma4_text

    module = gemma4_text if config["model_type"] in TEXT_TYPES else gemma4
    return module.Model, module.ModelArgs


def drafter_from(ckpt: Checkpoint, quantize_bits: Optional[int] = None,
                 quantize_mode: Optional[str] = None) -> Assistant:
    """The MTP assistant, through mlx-lm's loader: checkpoints saved quantized come back in their
    mode (affine, mxfp4, mxfp8, nvfp4), bits and group size, per-layer overrides included.
    `quantize_bits` / `quantize_mode` quantize a full-precision drafter after loading."""
    from mlx_lm.utils import load_model

    path = ckpt.path
    if not isinstance(ckpt.config.get("text_config"), dict):
        raise LoadError(f"drafter {path}: config.json has no text_config")
    quantized = "quantization" in ckpt.config or "quantization_config" in ckpt.config
    if quantized and (quantize_bits or quantize_mode):
        raise LoadError(f"drafter {path}: already quantized; cannot quantize it again")
    if quantize_bits or quantize_mode:
        check_quantization(quantize_bits, quantize_mode or "affine")  # before the weights are read

    class Config:  # what mlx-lm's loader builds the model from
        @staticmethod
        def from_dict(config: dict) -> AssistantConfig:
            return AssistantConfig.from_dict(config, ckpt.generation_config)

    overrides = {"text_config": normalize_text_config(text_config(ckpt.config))}
    try:
        assistant, _ = load_model(path, model_config=overrides, get_model_classes=lambda config: (Assistant, Config))
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise mlx_error("drafter", path, e) from None
    if quantize_bits or quantize_mode:
        quantize_drafter(assistant, quantize_bits, quantize_mode or "affine")
    return assistant


def check_pair(target: Target, assistant: Assistant, drafter_path: Path) -> None:
    """The drafter must read this target's hidden states, vocabulary and K/V: the same head
    sizes and K/V head counts per attention type, and no longer a sliding window than the target
    keeps. Assistants of different Gemma 4 sizes differ in at least one of these."""
    cfg, args = assistant.config, target.args
    problems = []
    if cfg.backbone_hidden_size != args.hidden_size:
        problems.append(f"backbone_hidden_size {cfg.backbone_hidden_size} != target hidden_size {args.hidden_size}")
    if assistant.vocab_size != args.vocab_size:
        problems.append(f"vocabulary {assistant.vocab_size} != target vocabulary {args.vocab_size}")
    target_head = head_dims(args)
    target_kv, drafter_kv = kv_heads(args), kv_heads(cfg.text)
    for i, (layer, kind) in enumerate(zip(assistant.model.layers, assistant.layer_types)):
        if kind not in target_head:
            problems.append(f"layer {i} has unknown attention type {kind}")
        elif layer.self_attn.head_dim != target_head[kind]:
            problems.append(f"layer {i} ({kind}) head_dim {layer.self_attn.head_dim} != target's {target_head[kind]}")
        elif drafter_kv[kind] != target_kv[kind] or layer.self_attn.n_heads % target_kv[kind]:
            problems.append(
                f"layer {i} ({kind}) is made for {drafter_kv[kind]} K/V heads with {layer.self_attn.n_heads} "
                f"query heads; the target has {target_kv[kind]}"
            )
    if cfg.text.sliding_window > args.sliding_window:
        problems.append(f"sliding_window {cfg.text.sliding_window} > target's {args.sliding_window}")
    if problems:
        raise LoadError(f"drafter {drafter_path} does not match the target: " + "; ".join(problems))


def drafter_for(ckpt: Checkpoint) -> str:
    """The assistant of the size this target has the structure of (any conversion or fine-tune
    of it), E2B's when none matches."""
    name = size_of(normalize_text_config(text_config(ckpt.config)))
    return SIZES[name or "e2b"].drafter
