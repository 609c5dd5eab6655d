"""`mlx_spec.load`: names to hub ids, the memory check, the target's and drafter's families
(models/registry.py), the tokenizer and its stop tokens, and the engine made of them."""

import os
from pathlib import Path
from typing import Optional, Tuple

from .decoding.lockstep import Lockstep, lost_peer
from .engine import Engine
from .errors import LoadError
from .media.side import MediaSide
from .memory import AUTO, DEFAULT_CONTEXT
from .memory import check as check_memory
from .models import FAMILIES, Registry, read
from .models.gemma4.sizes import SIZES
from .models.pair import ModelPair
from .text import TextSide, load_tokenizer, stop_token_ids

DEFAULT_TARGET = SIZES["e2b"].target
DEFAULT_DRAFTER = SIZES["e2b"].drafter


def load(
    model: str = DEFAULT_TARGET,
    drafter: Optional[str] = AUTO,
    drafter_bits: Optional[int] = None,
    drafter_mode: Optional[str] = None,
    context: int = DEFAULT_CONTEXT,
    force: bool = False,
    media: bool = False,
    registry: Registry = FAMILIES,
    group=None,
    experts: str = "whole",
) -> Engine:
    """Load a target and (unless `drafter` is None) its MTP drafter.

    `model`: a size by name (e2b, e4b, 26b-a4b, 31b, 12b: the 4-bit MLX conversion), a hub repo
    id or a local folder. `drafter`: "auto" (the drafter made for the target's size), a size by
    name, a hub id or a folder. `drafter_bits` (4 or 8) and `drafter_mode` (affine, mxfp4,
    mxfp8, nvfp4) quantize the drafter after loading. `media=True` loads the image and audio
    encoders now (by default, with the first prompt that has media: text prompts never pay for
    them). Before anything is downloaded, the memory the pair needs with `context` tokens is
    compared with this machine's; `force=True` loads it anyway. `registry`: the model families
    known (a caller's own family: `FAMILIES.with_family(...)`). `group`: an
    `mlx.core.distributed.Group` of more than one process (as `mlx.launch` starts them) splits
    the target over it, tensor-parallel, each rank reading its own shard of the weights; every
    rank must then make the same calls; `experts` "split" divides a mixture's experts between the
    ranks too (by default each keeps them whole). Raises `LoadError` with a message naming the
    problem; under a group, on every rank where any rank cannot load (its memory, its files).
    """
    lockstep = Lockstep(group if group is not None and group.size() > 1 else None)
    try:
        engine, refusal = _load(model, drafter, drafter_bits, drafter_mode, context, force, media, registry, lockstep,
                                experts), None
    except Exception as e:  # under a group, any failure of one rank's load (its disk, its memory) is agreed
        if lockstep.size == 1 or lost_peer(e):
            raise
        engine, refusal = None, e if isinstance(e, LoadError) else LoadError(
            f"rank {lockstep.rank} of the group could not load its share: {type(e).__name__}: {e}")
    if lockstep.size > 1:  # a rank that cannot load stops every rank, rather than leave them waiting for it
        first = int(lockstep.least(float(lockstep.rank if refusal is not None else lockstep.size)))
        if first < lockstep.size:
            raise refusal or LoadError(f"rank {first} of the group of {lockstep.size} could not load its share "
                                       f"(its own message says why); this rank ({lockstep.rank}) stops too")
    return engine


def _load(model, drafter, drafter_bits, drafter_mode, context, force, media, registry, lockstep, experts) -> Engine:
    _check_arguments(model, drafter, experts, lockstep)
    model, drafter = str(model), None if drafter is None else str(drafter)
    model, drafter = resolve_names(model, drafter, registry)
    needed = check_memory(model, drafter, context, force, registry, lockstep.size, experts)
    if lockstep.size > 1 and needed is not None:
        _refuse_unsplittable(needed, model, registry, lockstep.size, experts)
    target_checkpoint = read(model, "target")
    family = registry.family_of(target_checkpoint, "target")
    if lockstep.size > 1:
        if family.split is None:
            raise LoadError(f"target {target_checkpoint.path}: the {family.name} family cannot be split over a group")
        family.check_split(target_checkpoint.config, lockstep.size, target_checkpoint.path, experts)
    auto = drafter == AUTO
    if auto:
        drafter = family.drafter_for(target_checkpoint)
    # Both checkpoints are read, and checked against each other and the group, before any weight loads.
    drafter_checkpoint = None if drafter is None else _drafter_checkpoint(drafter, target_checkpoint, family, registry,
                                                                           lockstep.size)
    target = family.load_target(target_checkpoint)
    assistant = None
    if drafter_checkpoint is not None:
        assistant = family.load_drafter(drafter_checkpoint, drafter_bits, drafter_mode)
        try:
            family.check_pair(target, assistant, drafter_checkpoint.path)
        except LoadError as e:
            if not auto:
                raise
            size = family.size_of(target)
            why = f"the {size} size it has the structure of" if size else "no known size's structure, the nearest"
            raise LoadError(f"{e}. This drafter was chosen for the target (drafter=\"auto\": {why}); pass the "
                            "drafter made for it, or none (drafter=None, --no-mtp)") from None
        family.join(target, assistant)
    if lockstep.size > 1:
        family.split(target, assistant, lockstep.group, experts)
    evaluate_weights(target)
    tokenizer = load_tokenizer(target_checkpoint)
    text = TextSide(tokenizer, stop_token_ids(target_checkpoint, tokenizer), family.chat_format,
                    target_checkpoint.path)
    pair = ModelPair(family, target, assistant, target_checkpoint, drafter_checkpoint)
    engine = Engine(pair, text, MediaSide(target_checkpoint.path, target_checkpoint.config, family.load_media), lockstep)
    if media:
        engine.media.load()
    return engine


def _check_arguments(model, drafter, experts: str, lockstep: Lockstep) -> None:
    for name, value in (("model", model), ("drafter", drafter)):
        if not isinstance(value, (str, os.PathLike)) and not (name == "drafter" and value is None):
            raise LoadError(f"{name} must be a size, a hub id or a folder (a string or a path), got {type(value).__name__}")
    if experts not in ("whole", "split"):
        raise LoadError(f"experts must be \"whole\" or \"split\", got {experts!r}")
    if experts == "split" and lockstep.size == 1:
        raise LoadError("experts=\"split\" (--experts split) divides a mixture's experts between the ranks of a group "
                        "started by mlx.launch; this process runs alone, with every expert")


def _refuse_unsplittable(needed, model: str, registry: Registry, size: int, experts: str) -> None:
    """A pair the group cannot split, refused from the config.json files the memory check read,
    before anything is downloaded."""
    config = needed.target_config
    family = registry.family_for_config(config)
    if family is None or family.split is None or config.get("model_type") not in family.target_types:
        return  # (reading the checkpoint names what is wrong)
    family.check_split(config, size, model, experts)
    if needed.drafter_config is not None and family.check_drafter_split is not None:
        family.check_drafter_split(config, needed.drafter_config, size, needed.drafter)


def _drafter_checkpoint(drafter: str, target_checkpoint, family, registry: Registry, size: int):
    """The drafter's checkpoint, of the target's family and splittable as the target is."""
    checkpoint = read(drafter, "drafter")
    if registry.family_of(checkpoint, "drafter") is not family or family.load_drafter is None:
        raise LoadError(f"drafter {checkpoint.path} is not a drafter of the {family.name} family, "
                        f"which the target {target_checkpoint.path} is of")
    if size > 1 and family.check_drafter_split is not None:
        family.check_drafter_split(target_checkpoint.config, checkpoint.config, size, checkpoint.path)
    return checkpoint


def resolve_names(model: str, drafter: Optional[str], registry: Registry = FAMILIES) -> Tuple[str, Optional[str]]:
    """Sizes given by name become their hub ids: the target's 4-bit MLX conversion, and for
    drafter "auto" its drafter when the target is a size known by name or id."""
    size = None if _is_folder(model) else registry.size(model)
    if size is not None:
        model = size.target
    if drafter == AUTO and size is not None:
        drafter = size.drafter
    elif drafter not in (None, AUTO) and not _is_folder(drafter) and str(drafter).lower() in registry.size_names:
        drafter = registry.size(drafter).drafter
    return model, drafter


def _is_folder(name: str) -> bool:
    return Path(name).expanduser().exists()  # a folder of a size's name wins over the name


def evaluate_weights(target) -> None:
    """Read the target's weights now, a layer at a time (its loader leaves them lazy, so that a
    rank of a group keeps only its shard: each tensor is read whole and cut, and no more than a
    layer's whole tensors are held at once): a load's errors and its time belong to the load."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    pieces = {}
    for name, array in tree_flatten(target.model.parameters()):
        pieces.setdefault(name.split(".layers.")[-1].split(".")[0] if ".layers." in name else name, []).append(array)
    for arrays in pieces.values():
        mx.eval(arrays)
