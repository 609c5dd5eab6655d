"""Find, check and load the Gemma 4 target and its MTP assistant.

Hub ids are downloaded with huggingface-hub (only configs, tokenizer files and safetensors);
local folders are read as they are. Only safetensors are read and no code from a checkpoint runs.
Every problem a user can cause is reported as a `LoadError` naming the path and what is wrong.
"""

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .assistant import Assistant, AssistantConfig
from .family import FAMILY, by_name, by_target, for_config
from .gemma4 import TEXT_TYPES, head_dims, kv_heads, normalize_text_config, text_config
from .target import Target

DEFAULT_TARGET = FAMILY["e2b"].target
DEFAULT_DRAFTER = FAMILY["e2b"].drafter
AUTO = "auto"  # the drafter: the assistant of the target's size

# The multimodal wrappers as google ships them and their text models alone; the 12B
# (`gemma4_unified*`) has the same text network and assistant as the other sizes.
TARGET_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
DRAFTER_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
]


class LoadError(Exception):
    """A checkpoint could not be used; the message names the path and the problem."""


@dataclass
class Checkpoint:
    path: Path
    config: dict
    generation_config: dict


def resolve(path_or_repo: str, what: str) -> Path:
    """A local folder, or a hub repo id downloaded (configs, tokenizer and safetensors only)."""
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"{what} {path_or_repo}: not a folder")
        return path
    if not _looks_like_repo_id(path_or_repo):
        raise LoadError(f"{what} {path_or_repo}: no such folder")
    return _download(path_or_repo, what)


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _download(repo_id: str, what: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except GatedRepoError:
        raise LoadError(
            f"{what} {repo_id}: the repository is gated; accept its license on the hub and log in"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError):
        raise LoadError(f"{what} {repo_id}: no such folder, and no such repository on the hub") from None
    except LocalEntryNotFoundError:
        raise LoadError(
            f"{what} {repo_id}: no such folder; as a hub repo it is not in the local cache either, "
            "and the hub cannot be reached (offline?)"
        ) from None


def read_checkpoint(path: Path, what: str) -> Checkpoint:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise LoadError(f"{what} {path}: no config.json")
    config = _read_json(config_file, what)
    generation = path / "generation_config.json"
    generation_config = _read_json(generation, what) if generation.is_file() else {}
    for name, value in (("config.json", config), ("generation_config.json", generation_config)):
        if not isinstance(value, dict):
            raise LoadError(f"{what} {path}: {name} is not a JSON object")
    if not weight_files(path):
        raise LoadError(f"{what} {path}: no weights (model*.safetensors)")
    return Checkpoint(path, config, generation_config)


def weight_files(path: Path) -> list:
    # The names mlx-lm reads; only safetensors, never pickles.
    return sorted(glob.glob(str(path / "model*.safetensors")))


def _read_json(file: Path, what: str) -> dict:
    try:
        with open(file) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise LoadError(f"{what} {file}: not valid JSON ({e})") from None


def _check_type(ckpt: Checkpoint, what: str, expected: Tuple[str, ...]) -> None:
    model_type = ckpt.config.get("model_type")
    if model_type in expected:
        return
    if what == "target" and model_type in DRAFTER_TYPES:
        raise LoadError(f"target {ckpt.path}: this is an MTP drafter ({model_type}); pass it as the drafter")
    if what == "drafter" and model_type in TARGET_TYPES:
        raise LoadError(f"drafter {ckpt.path}: this is a Gemma 4 target ({model_type}); pass it as the target")
    raise LoadError(f"{what} {ckpt.path}: model_type {model_type!r} is not one of {', '.join(expected)}")


def _mlx_error(what: str, path: Path, error: Exception) -> LoadError:
    one_line = " ".join(str(error).split())
    return LoadError(f"{what} {path}: the weights do not fit the config: {one_line}")


def load_target(path_or_repo: str) -> Tuple[Target, Checkpoint]:
    from mlx_lm.utils import load_model

    path = resolve(path_or_repo, "target")
    ckpt = read_checkpoint(path, "target")
    _check_type(ckpt, "target", TARGET_TYPES)
    text = normalize_text_config(text_config(ckpt.config))
    if text.get("use_bidirectional_attention") == "all":
        raise LoadError(f"target {path}: use_bidirectional_attention is \"all\" (every token attends both "
                        "ways): not a causal language model, nothing to decode with")
    if ckpt.config["model_type"] in TEXT_TYPES:
        overrides = text
    else:
        # mlx-lm's wrapper copies its own top-level vocab_size (default 262144) into the text config.
        overrides = {"text_config": text, "vocab_size": text.get("vocab_size", 262144)}
    try:
        model, _ = load_model(path, model_config=overrides, get_model_classes=_target_classes)
    except (ValueError, RuntimeError) as e:
        raise _mlx_error("target", path, e) from None
    return Target(model, images_attend_both_ways=text.get("use_bidirectional_attention") == "vision"), ckpt


def _target_classes(config: dict):
    """mlx-lm's Gemma 4 classes for every target type: its text model for a text checkpoint, its
    multimodal wrapper (which drops the media weights) for google's and the MLX conversions'."""
    from mlx_lm.models import gemma4, gemma4_text

    module = gemma4_text if config["model_type"] in TEXT_TYPES else gemma4
    return module.Model, module.ModelArgs


def load_drafter(
    path_or_repo: str, quantize_bits: Optional[int] = None, quantize_mode: Optional[str] = None
) -> Tuple[Assistant, Checkpoint]:
    """The MTP assistant, through mlx-lm's loader: checkpoints saved quantized come back in their
    mode (affine, mxfp4, mxfp8, nvfp4), bits and group size, per-layer overrides included.
    `quantize_bits` / `quantize_mode` quantize a full-precision drafter after loading."""
    from mlx_lm.utils import load_model

    path = resolve(path_or_repo, "drafter")
    ckpt = read_checkpoint(path, "drafter")
    _check_type(ckpt, "drafter", DRAFTER_TYPES)
    if not isinstance(ckpt.config.get("text_config"), dict):
        raise LoadError(f"drafter {path}: config.json has no text_config")
    quantized = "quantization" in ckpt.config or "quantization_config" in ckpt.config
    if quantized and (quantize_bits or quantize_mode):
        raise LoadError(f"drafter {path}: already quantized; cannot quantize it again")

    class Config:  # what mlx-lm's loader builds the model from
        @staticmethod
        def from_dict(config: dict) -> AssistantConfig:
            return AssistantConfig.from_dict(config, ckpt.generation_config)

    overrides = {"text_config": normalize_text_config(text_config(ckpt.config))}
    try:
        assistant, _ = load_model(path, model_config=overrides, get_model_classes=lambda config: (Assistant, Config))
    except (ValueError, RuntimeError, KeyError) as e:
        raise _mlx_error("drafter", path, e) from None
    if quantize_bits or quantize_mode:
        quantize_drafter(assistant, quantize_bits, quantize_mode or "affine")
    return assistant, ckpt


# Each mode MLX quantizes in, with the bits and group size it allows (affine: 4 or 8 bits here).
QUANT_MODES = {"affine": (None, 64), "mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}


def quantize_drafter(assistant: Assistant, bits: Optional[int], mode: str = "affine") -> None:
    if mode not in QUANT_MODES:
        raise LoadError(f"drafter quantization mode must be one of {', '.join(QUANT_MODES)}, got {mode!r}")
    mode_bits, group_size = QUANT_MODES[mode]
    if mode == "affine" and bits not in (4, 8):
        raise LoadError(f"drafter quantization must be 4 or 8 bits, got {bits}")
    if mode_bits and bits not in (None, mode_bits):
        raise LoadError(f"drafter quantization mode {mode} is {mode_bits}-bit, got {bits} bits")

    def fits(path: str, module: nn.Module) -> bool:
        if not hasattr(module, "to_quantized"):
            return False
        return module.weight.shape[-1] % group_size == 0

    nn.quantize(assistant, group_size=group_size, bits=bits or mode_bits, mode=mode, class_predicate=fits)
    mx.eval(assistant.parameters())


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


def resolve_names(model: str, drafter: Optional[str]) -> Tuple[str, Optional[str]]:
    """Sizes given by name become their hub ids: the target's 4-bit MLX conversion, and for
    drafter "auto" its assistant when the target is a size known by name or id."""
    size = None if _is_folder(model) else by_target(model)
    if size is not None:
        model = size.target
    if drafter == AUTO and size is not None:
        drafter = size.drafter
    elif drafter not in (None, AUTO) and not _is_folder(drafter) and by_name(drafter) is not None:
        drafter = by_name(drafter).drafter
    return model, drafter


def _is_folder(name: str) -> bool:
    return Path(name).expanduser().exists()  # a folder of a size's name wins over the name


def drafter_for(ckpt: Checkpoint) -> str:
    """The assistant of the size this target has the structure of (any conversion or fine-tune
    of it), E2B's when none matches."""
    size = for_config(normalize_text_config(text_config(ckpt.config)))
    return size.drafter if size is not None else DEFAULT_DRAFTER


def load_tokenizer(ckpt: Checkpoint) -> Optional[Any]:
    """mlx-lm's tokenizer wrapper (with its streaming detokenizer), or None if the checkpoint
    folder has no tokenizer (token-id prompts still work)."""
    if not (ckpt.path / "tokenizer.json").is_file() and not (ckpt.path / "tokenizer.model").is_file():
        return None
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    eos = ckpt.config.get("eos_token_id", ckpt.generation_config.get("eos_token_id"))
    eos = ckpt.generation_config.get("eos_token_id", eos)
    return mlx_load_tokenizer(ckpt.path, eos_token_ids=eos)
