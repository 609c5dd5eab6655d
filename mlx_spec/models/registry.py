"""Model families, found by a checkpoint's `model_type`: how each loads, and what it brings.

vLLM keys its model registry by the config's architecture; we key ours by `model_type`, the
target's and its drafter's. A family is one `Family` value (models/gemma4/__init__.py makes
Gemma 4's), and adding one is a folder and an entry in a `Registry`: nothing in the loop, the
engine or the front ends names a family. The engine reads only what a `Family` says.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import LoadError
from .checkpoint import Checkpoint


@dataclass(frozen=True)
class Size:
    """A model of a family known by a short name: its target's and its drafter's hub ids."""

    name: str
    target: str
    drafter: Optional[str]


@dataclass(frozen=True)
class Family:
    name: str
    target_types: Tuple[str, ...]  # config.json `model_type`s of its targets
    drafter_types: Tuple[str, ...]  # ... and of its MTP drafters (none: it drafts by lookup only)
    load_target: Callable[[Checkpoint], Any]  # -> a models.protocol.TargetModel
    chat_format: Any  # models.protocol.ChatFormat: how its chat template's output reads
    # (checkpoint, quantize bits, quantize mode) -> a models.protocol.DraftModel
    load_drafter: Optional[Callable[[Checkpoint, Optional[int], Optional[str]], Any]] = None
    # (target, draft model, drafter path): a LoadError where the drafter cannot read the target
    check_pair: Callable[[Any, Any, Path], None] = lambda target, drafter, path: None
    # (target, draft model): each given what it reads of the other (a drafter whose layer's K/V
    # the target's passes write, say), after check_pair.
    join: Callable[[Any, Any], None] = lambda target, drafter: None
    # The drafter (hub id or folder) made for this target checkpoint, or None (the target's own
    # folder, where its checkpoint holds its MTP layer).
    drafter_for: Callable[[Checkpoint], Optional[str]] = lambda checkpoint: None
    sizes: Mapping[str, Size] = field(default_factory=dict)
    # The short name of the size a loaded target has the structure of, or None.
    size_of: Callable[[Any], Optional[str]] = lambda target: None
    # (checkpoint folder, config.json) -> the media encoder (media/), or None without media input.
    load_media: Optional[Callable[[Path, dict], Any]] = None
    # (config.json, context, positions a sliding cache holds past its window) -> K/V cache bytes.
    kv_cache_bytes: Optional[Callable[[Mapping[str, Any], int, int], Optional[int]]] = None
    # (config.json) -> the positions a target attends over at most, or None where it does not say:
    # the memory check counts no K/V past them, whatever context it is asked for.
    context_of: Callable[[Mapping[str, Any]], Optional[int]] = lambda config: None
    # Tensor parallelism over a group of processes (mlx.core.distributed): (config.json, group
    # size, path, experts) -> a LoadError where the split is impossible, before any weight is
    # read; and (target, draft model or None, group, experts) -> both split in place. `experts`:
    # "whole" or "split", for a mixture of experts. None: the family runs whole.
    check_split: Optional[Callable[[Mapping[str, Any], int, Path, str], None]] = None
    # (the target's config.json, the drafter's, group size, the drafter's path) -> a LoadError
    # where the drafter cannot be split as the target is, before its weights are read.
    check_drafter_split: Optional[Callable[[Mapping[str, Any], Mapping[str, Any], int, Path], None]] = None
    split: Optional[Callable[[Any, Optional[Any], Any, str], None]] = None
    # (config.json, group size, experts, context, sliding slack) -> (weights, K/V cache): the
    # share of each one rank holds.
    rank_share: Optional[Callable[[Mapping[str, Any], int, str, int, int], Tuple[float, float]]] = None


class Registry:
    """The families a `load` knows, in order (the first is the default for targets made by hand)."""

    def __init__(self, families: Iterable[Family]):
        self.families: List[Family] = list(families)
        if not self.families:
            raise ValueError("a registry needs at least one family")

    def with_family(self, family: Family) -> "Registry":
        """This registry and one more family (the registry itself is left as it is)."""
        return Registry([*self.families, family])

    @property
    def default(self) -> Family:
        return self.families[0]

    def family_of(self, checkpoint: Checkpoint, role: str) -> Family:
        """The family of a target (`role` "target") or drafter ("drafter") checkpoint; a
        LoadError naming the model type, and the other role when it is that."""
        model_type = checkpoint.config.get("model_type")
        for family in self.families:
            if model_type in (family.target_types if role == "target" else family.drafter_types):
                return family
        for family in self.families:
            if role == "target" and model_type in family.drafter_types:
                raise LoadError(f"target {checkpoint.path}: this is an MTP drafter ({model_type}); pass it as the drafter")
            if role == "drafter" and model_type in family.target_types:
                raise LoadError(f"drafter {checkpoint.path}: this is a {family.name} target ({model_type}); pass it as "
                                "the target")
        known = [t for f in self.families for t in (f.target_types if role == "target" else f.drafter_types)]
        raise LoadError(f"{role} {checkpoint.path}: model_type {model_type!r} is not one of {', '.join(known)}")

    def size(self, name_or_id: Any) -> Optional[Size]:
        """The size a short name (any case) or a target hub id (any case) means, else None."""
        if not isinstance(name_or_id, str):
            return None
        wanted = name_or_id.lower()
        for family in self.families:
            if wanted in family.sizes:
                return family.sizes[wanted]
        for family in self.families:
            for size in family.sizes.values():
                if size.target.lower() == wanted:
                    return size
        return None

    @property
    def size_names(self) -> Tuple[str, ...]:
        return tuple(name for family in self.families for name in family.sizes)

    def family_for_config(self, config: Mapping[str, Any]) -> Optional[Family]:
        """The family whose target or drafter a config.json is, else None."""
        model_type = config.get("model_type")
        for family in self.families:
            if model_type in family.target_types or model_type in family.drafter_types:
                return family
        return None

    def family_of_size(self, size: Size) -> Family:
        return next(f for f in self.families if size in f.sizes.values())


def sizes_by_name(sizes: Iterable[Size]) -> Dict[str, Size]:
    return {size.name: size for size in sizes}
