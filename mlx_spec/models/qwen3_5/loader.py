"""Loading a Qwen3.5 / Qwen3.6 target (mlx-lm's own network) and the MTP layer its checkpoint
holds under `mtp.` (which mlx-lm's loader drops) from a checkpoint already read
(models/checkpoint.py). Every problem a user can cause is a `LoadError` naming the path."""

import warnings
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn

from ...errors import LoadError
from ..checkpoint import Checkpoint, mlx_error, weight_files
from ..quantize import quantize_drafter
from .drafter import MTPDraft
from .mtp import MTPLayer, sanitize
from .target import Target

# The multimodal wrappers as Qwen publishes them, and their text models alone.
TARGET_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# A drafter: a target's own checkpoint, or the MTP layer split into a folder of its own (mlx-vlm's
# splitter: its weights without the `mtp.` prefix, the experts split, the norms shifted; the
# target's text config under `text_config`).
SPLIT_MTP = "qwen3_5_mtp"
DRAFTER_TYPES = (*TARGET_TYPES, SPLIT_MTP)
WHERE_MTP_IS = ("The MTP layer is in Qwen's own checkpoints (Qwen/Qwen3.6-27B, ...), in conversions that keep mtp.*, "
                "and split into folders of its own (model_type qwen3_5_mtp, as mlx-vlm's splitter writes them): pass "
                "one of those as the drafter, or draft without it (--no-mtp; prompt lookup still drafts)")


def text_config(config: dict) -> dict:
    """The text model's fields: a multimodal config's `text_config`, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def target_from(ckpt: Checkpoint) -> Any:
    """mlx-lm's Qwen3.5 model (its MoE's for a mixture of experts) with the checkpoint's weights,
    read lazily (loading.py evaluates them)."""
    from mlx_lm.models import qwen3_5, qwen3_5_moe
    from mlx_lm.utils import load_model

    module = qwen3_5_moe if "moe" in ckpt.config["model_type"] else qwen3_5
    try:
        model, _ = load_model(ckpt.path, lazy=True, get_model_classes=lambda config: (module.Model, module.ModelArgs))
    except (ValueError, RuntimeError, KeyError, TypeError) as e:
        raise mlx_error("target", ckpt.path, e) from None
    return model


def mtp_layers_of(text: dict) -> int:
    """How many MTP layers a text config says the checkpoint holds (Qwen3-Next's name too)."""
    return int(text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)) or 0)


def mtp_layers(ckpt: Checkpoint) -> int:
    return mtp_layers_of(text_config(ckpt.config))


def load_target(ckpt: Checkpoint) -> Any:
    """The family's target (target.py) over mlx-lm's network with the checkpoint's weights."""
    return Target(target_from(ckpt))


def text_args(ckpt: Checkpoint) -> Any:
    """mlx-lm's text model arguments of a checkpoint's config (as its Model makes them; a split
    MTP folder's from the target's text config it carries)."""
    from mlx_lm.models import qwen3_5

    try:
        if ckpt.config.get("model_type") == SPLIT_MTP:
            return qwen3_5.TextModelArgs.from_dict(ckpt.config["text_config"])
        return qwen3_5.TextModelArgs.from_dict(qwen3_5.ModelArgs.from_dict(ckpt.config).text_config)
    except (TypeError, ValueError, KeyError) as e:
        raise LoadError(f"target {ckpt.path}: its config.json does not describe a Qwen3.5 model: {e}") from None


def drafter_for(ckpt: Checkpoint) -> Optional[str]:
    """The target's own checkpoint, where it holds an MTP layer. A conversion that dropped the
    layer's weights (mlx-lm's do) but kept the config's count drafts by prompt lookup alone,
    with a warning saying why (rather than failing to load)."""
    if mtp_layers(ckpt) < 1 or ckpt.config.get("model_type") == SPLIT_MTP:  # (a drafter itself: no target's)
        return None
    if not has_mtp_weights(ckpt.path):
        warnings.warn(f"{ckpt.path}: config.json says it has an MTP layer, but its weights hold none (mlx-lm's "
                      "conversions drop them): it drafts by prompt lookup alone. Convert from the original "
                      "checkpoint keeping mtp.* to draft with its MTP layer.")  # (said once: the memory check asks too)
        return None
    return str(ckpt.path)


def has_mtp_weights(path: Path) -> bool:
    """Whether the checkpoint's weight files name any tensor under `mtp.`, read from their
    headers (no weight is read). True where there are no files to read yet (a hub id whose
    weights are not downloaded: its config is all there is to go by)."""
    from safetensors import SafetensorError, safe_open

    files = weight_files(Path(path))
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as weights:  # (the header alone is read)
                names = list(weights.keys())
        except (OSError, SafetensorError):
            return True  # (unreadable: loading it says what is wrong)
        if any(name.startswith("mtp.") for name in names):
            return True
    return not files


def drafter_from(ckpt: Checkpoint, quantize_bits: Optional[int] = None, quantize_mode: Optional[str] = None) -> MTPDraft:
    """The MTP layer of a target checkpoint as a draft model (quantized after loading when asked)."""
    draft = MTPDraft(mtp_from(ckpt, text_args(ckpt)))
    if quantize_bits is not None or quantize_mode is not None:
        quantize_drafter(draft.layer, quantize_bits, quantize_mode or "affine")
    mx.eval(draft.layer.parameters())  # read now: a load's errors and time belong to the load
    return draft


def check_pair(target: Target, draft: MTPDraft, drafter_path: Path) -> None:
    """The MTP layer reads the target's hidden states and embeds and scores with its vocabulary."""
    ours, theirs = draft.layer.fc.weight.shape[0], target.hidden_size
    if ours != theirs:
        raise LoadError(f"drafter {drafter_path}: its MTP layer is made for hidden size {ours}; the target's is {theirs}")


def join(target: Target, draft: MTPDraft) -> None:
    """Each reads the other's part: the target's passes write the MTP layer's K/V, and the draft
    model embeds and scores with the target's embedding and head."""
    target.mtp, draft.target = draft.layer, target


def mtp_from(ckpt: Checkpoint, args: Any) -> MTPLayer:
    """The checkpoint's MTP layer, for a target of mlx-lm's text model arguments `args`."""
    count = mtp_layers(ckpt)
    if count != 1:
        raise LoadError(f"drafter {ckpt.path}: config.json says mtp_num_hidden_layers {count}; its MTP drafting "
                        f"needs exactly 1 (Qwen3.5 and Qwen3.6 have 1). {WHERE_MTP_IS}")
    weights = {}
    for file in weight_files(ckpt.path):
        try:
            arrays = mx.load(file)  # lazy: only the MTP layer's arrays are ever read
        except (ValueError, RuntimeError) as e:
            raise mlx_error("target", ckpt.path, e) from None
        if ckpt.config.get("model_type") == SPLIT_MTP:  # the layer alone, its names unprefixed
            arrays = {k if k.startswith("mtp.") else f"mtp.{k}": v for k, v in arrays.items()}
        weights.update({k: v for k, v in arrays.items() if k.startswith("mtp.")})
    if not weights:
        raise LoadError(f"drafter {ckpt.path}: config.json says it has an MTP layer, but no weight is under mtp. "
                        f"(mlx-lm's conversions drop them). {WHERE_MTP_IS}")
    layer, weights = MTPLayer(args), sanitize(weights)
    quantized_as(layer, weights, ckpt)
    try:
        layer.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise LoadError(f"target {ckpt.path}: its mtp. weights do not fit a Qwen3.5 MTP layer of this target: {e}") from None
    return layer


def quantized_as(layer: MTPLayer, weights: dict, ckpt: Checkpoint) -> None:
    """The layer quantized as its stored weights are, where they are (an MLX conversion that
    kept or added the MTP layer quantizes it as the target: the config's `quantization`), each
    module that has stored scales, as mlx-lm loads a model."""
    if not any(k.endswith(".scales") for k in weights):
        return
    settings = ckpt.config.get("quantization") or text_config(ckpt.config).get("quantization")
    if not isinstance(settings, dict) or "bits" not in settings:
        raise LoadError(f"target {ckpt.path}: its mtp. weights are quantized, and config.json says not how "
                        "(no \"quantization\" with its bits and group size)")
    nn.quantize(layer, group_size=settings.get("group_size", 64), bits=settings["bits"],
                mode=settings.get("mode", "affine"), class_predicate=lambda path, _: f"{path}.scales" in weights)
