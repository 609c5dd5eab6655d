"""How much memory a target and its drafter need, and whether this machine has it.

The estimate is the weights (the safetensors files as they are on disk, or as the hub lists
them before anything is downloaded) plus the target's K/V cache at the requested context, read
from its config as its family counts it (models/registry.py: `Family.kv_cache_bytes`). The
drafter keeps no cache: it reads the target's. The "auto" drafter is the one the target's family
names for its config (`Family.drafter_for`), counted whenever its size can be known.
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

import mlx.core as mx

from .decoding.limits import PREFILL_CHUNK, TRIM_ALLOWANCE
from .errors import LoadError
from .models import FAMILIES, Checkpoint, Registry

GB = 1e9
DEFAULT_CONTEXT = 8192
AUTO = "auto"  # the drafter: the one made for the target's size
# What a sliding cache holds beyond its window after a long prompt (models/cache.py): the
# drafter's extra position, the positions it can trim, and a prefill chunk.
SLIDING_SLACK = 1 + TRIM_ALLOWANCE + PREFILL_CHUNK


def size_text(nbytes: float) -> str:
    """A size for a message: in GB, or MB where GB would read 0.00 (a tiny model's K/V)."""
    return f"{nbytes / GB:.2f} GB" if abs(nbytes) >= 0.01 * GB else f"{nbytes / 1e6:.2f} MB"


@dataclass
class Estimate:
    weights: int  # bytes
    kv_cache: int  # bytes at `context` tokens
    context: int
    drafter: Optional[str] = None  # the drafter counted in `weights`, if any
    target_config: Optional[dict] = field(default=None, repr=False)  # config.json, as read for the count
    drafter_config: Optional[dict] = field(default=None, repr=False)  # the drafter's, where counted

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def describe(self) -> str:
        return (f"{self.total / GB:.1f} GB ({self.weights / GB:.1f} GB of weights, "
                f"{self.kv_cache / GB:.1f} GB of K/V cache at {self.context} tokens)")


def available_bytes() -> int:
    """What this machine lets one process use: the GPU's recommended working set on a Mac,
    physical memory elsewhere."""
    if mx.metal.is_available():
        size = mx.device_info().get("max_recommended_working_set_size")
        if size:
            return int(size)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_cache_bytes(config: Mapping[str, Any], context: int, registry: Registry = FAMILIES,
                   ranks: int = 1) -> Optional[int]:
    """Bytes of a target's K/V cache at `context` tokens, from its config.json (or the published
    text config of a size), as its family counts them; None where no family can. `ranks`: one
    rank's share where the target is split over that many."""
    family = registry.family_for_config(config) or registry.default
    if family.kv_cache_bytes is None:
        return None
    whole = family.kv_cache_bytes(config, context, SLIDING_SLACK)
    if ranks > 1 and family.rank_share is not None:
        return int(whole * family.rank_share(config, ranks, "whole", context, SLIDING_SLACK)[1])
    return whole


def estimate(target: str, drafter: Optional[str], context: int = DEFAULT_CONTEXT,
             registry: Registry = FAMILIES, ranks: int = 1, experts: str = "whole") -> Optional[Estimate]:
    """Weights + K/V cache of a pair (hub ids or folders), without downloading any weights;
    None where the sizes cannot be known (offline and not downloaded yet). `ranks`: the target
    split over a group of that many processes, one rank's share (its family's `rank_share`)."""
    weights, config = _files_and_config(target, registry)
    if config is not None:  # (a context past the model's own never holds more K/V than its own)
        family = registry.family_for_config(config) or registry.default
        context = min(context, family.context_of(config) or context)
    kv_cache = kv_cache_bytes(config, context, registry) if config is not None else None
    if weights is None or kv_cache is None:
        return None
    if ranks > 1:
        family = registry.family_for_config(config) or registry.default
        if family.rank_share is not None:
            weight_share, cache_share = family.rank_share(config, ranks, experts, context, SLIDING_SLACK)
            weights, kv_cache = int(weights * weight_share), int(kv_cache * cache_share)
    auto, drafter_weights, drafter_config = drafter == AUTO, None, None
    if auto:
        drafter = auto_drafter(target, config, registry)
    if drafter is not None:
        drafter_weights, drafter_config = _files_and_config(drafter, registry)
        if drafter_weights is None and not auto:
            return None
        # (An auto drafter not known offline is left out: the target alone is still checked.)
        # (A drafter in the target's own checkpoint, as Qwen3.5's MTP layer is, is counted there.)
        weights += (drafter_weights or 0) if not _same_folder(drafter, target) else 0
    counted = drafter if drafter_weights else None
    return Estimate(weights, kv_cache, context, counted, config, drafter_config if counted else None)


def _same_folder(drafter: str, target: str) -> bool:
    return drafter == target or Path(drafter).expanduser().resolve() == Path(target).expanduser().resolve()


def auto_drafter(target: str, config: dict, registry: Registry) -> Optional[str]:
    """The drafter the target's family names for its config, or None."""
    family = registry.family_for_config(config) or registry.default
    try:
        return family.drafter_for(Checkpoint(Path(target), config, {}))
    except Exception:  # a config its family cannot read: loading it names what is wrong
        return None


def _files_and_config(path_or_repo: str, registry: Registry) -> Tuple[Optional[int], Optional[dict]]:
    """(bytes of model*.safetensors, config.json) of a folder, of a hub repo already in the
    local cache, or of a hub repo as the hub lists it; None for what cannot be found."""
    folder = Path(path_or_repo).expanduser()
    if not folder.is_dir():
        folder = _cached_snapshot(path_or_repo)
    if folder is not None:
        sizes = [f.stat().st_size for f in folder.glob("model*.safetensors")]
        return (sum(sizes) if sizes else None), read_config(folder / "config.json")
    sizes = _hub_sizes(path_or_repo)
    if sizes is None:  # (the estimate needs both; offline, the config's download retried for 25 s)
        return None, None
    return sizes, _hub_config(path_or_repo, registry)


def read_config(file: Path) -> Optional[dict]:
    """A config.json as a dict, or None where there is none to read."""
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _cached_snapshot(repo_id: str) -> Optional[Path]:
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, allow_patterns=["config.json", "*.safetensors"], local_files_only=True))
    except Exception:  # not a repo id, or not in the cache
        return None
    return folder if any(folder.glob("model*.safetensors")) else None


def _hub_sizes(repo_id: str) -> Optional[int]:
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception:  # offline, no such repo, gated: the download will say which
        return None
    sizes = [f.size for f in info.siblings or [] if f.rfilename.startswith("model") and f.rfilename.endswith(".safetensors")]
    return sum(s or 0 for s in sizes) if sizes else None


def _hub_config(repo_id: str, registry: Registry) -> Optional[dict]:
    """The published config of a size known by this hub id, else its config.json on the hub."""
    size = registry.size(repo_id)
    if size is not None and getattr(size, "config", None) is not None:
        return dict(size.config)
    try:
        from huggingface_hub import hf_hub_download

        return read_config(Path(hf_hub_download(repo_id, "config.json")))
    except Exception:
        return None


def check(target: str, drafter: Optional[str], context: int = DEFAULT_CONTEXT, force: bool = False,
          registry: Registry = FAMILIES, ranks: int = 1, experts: str = "whole") -> Optional[Estimate]:
    """Raise a LoadError when the pair needs more memory than this machine has,
    unless `force`. Returns the estimate (None when it cannot be made). `ranks`: one rank's
    share of a target split over a group (each rank checks its own machine)."""
    needed = estimate(target, drafter, context, registry, ranks, experts)
    if needed is None or force:
        return needed
    have = available_bytes()
    if needed.total > have:
        pair = target + (f" + {needed.drafter}" if needed.drafter else "") + (f" (one rank's share of {ranks})" if ranks > 1 else "")
        raise LoadError(
            f"target {target}: {pair} needs about {needed.describe()}, and this machine has "
            f"{have / GB:.1f} GB for it; choose a smaller model or context, or pass force=True "
            f"(--force) to load it anyway"
        )
    return needed
