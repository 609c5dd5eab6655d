"""How much memory a target and its drafter need, and whether this machine has it.

The estimate is the weights (the safetensors files as they are on disk, or as the hub lists
them before anything is downloaded) plus the target's K/V cache at the requested context, read
from its config: the layers that compute K/V (K/V-shared layers hold none), a sliding window's
worth of positions on sliding layers, the whole context on full ones, keys and values both (a
keys-equal-values layer still caches its values apart: they are normalised differently). The
drafter keeps no cache: it reads the target's.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import mlx.core as mx

from .family import by_target
from .gemma4 import FULL, SLIDING, TRIM_ALLOWANCE, cached_layer_types, head_dims, kv_heads, normalize_text_config
from .gemma4 import text_config as language_config
from .loading import LoadError

GB = 1e9
DEFAULT_CONTEXT = 8192
# What a sliding cache holds beyond its window after a long prompt (cache.SlidingWindowCache):
# the drafter's extra position, the positions it can trim, and a prefill chunk of 512.
SLIDING_SLACK = 1 + TRIM_ALLOWANCE + 512


@dataclass
class Estimate:
    weights: int  # bytes
    kv_cache: int  # bytes at `context` tokens
    context: int

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
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_cache_bytes(text: dict, context: int) -> int:
    """Bytes of the target's K/V cache at `context` tokens, from its text config."""
    heads, dims = kv_heads(text), head_dims(text)
    per_position = {kind: heads[kind] * dims[kind] for kind in (SLIDING, FULL)}
    positions = {SLIDING: min(context, text["sliding_window"] + SLIDING_SLACK), FULL: context}
    dtype = text.get("dtype") or text.get("torch_dtype") or "bfloat16"
    item = 4 if dtype == "float32" else 2
    return sum(2 * per_position[kind] * positions[kind] * item for kind in cached_layer_types(text))


def estimate(target: str, drafter: Optional[str], context: int = DEFAULT_CONTEXT) -> Optional[Estimate]:
    """Weights + K/V cache of a pair (hub ids or folders), without downloading any weights;
    None where the sizes cannot be known (offline and not downloaded yet)."""
    weights, text = _files_and_config(target)
    if weights is None or text is None:
        return None
    if drafter is not None:
        drafter_weights, _ = _files_and_config(drafter)
        if drafter_weights is None:
            return None
        weights += drafter_weights
    return Estimate(weights, kv_cache_bytes(text, context), context)


def _files_and_config(path_or_repo: str):
    """(bytes of model*.safetensors, the text config) of a folder, of a hub repo already in the
    local cache, or of a hub repo as the hub lists it; None for what cannot be found."""
    folder = Path(path_or_repo).expanduser()
    if not folder.is_dir():
        folder = _cached_snapshot(path_or_repo)
    if folder is not None:
        sizes = [f.stat().st_size for f in folder.glob("model*.safetensors")]
        return (sum(sizes) if sizes else None), _text_config(folder / "config.json")
    return _hub_sizes(path_or_repo), _hub_text_config(path_or_repo)


def _text_config(file: Path) -> Optional[dict]:
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = language_config(config)
    if not isinstance(text, dict):
        return None
    text = normalize_text_config(text)  # per_layer_config's full-layer sizes, transformers' defaults
    if "dtype" not in text and "torch_dtype" not in text:
        text["dtype"] = config.get("dtype") or config.get("torch_dtype")
    needed = ("num_hidden_layers", "head_dim", "sliding_window")
    return text if all(k in text for k in needed) else None


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


def _hub_text_config(repo_id: str) -> Optional[dict]:
    size = by_target(repo_id)
    if size is not None:
        return dict(size.text)
    try:
        from huggingface_hub import hf_hub_download

        return _text_config(Path(hf_hub_download(repo_id, "config.json")))
    except Exception:
        return None


def check(target: str, drafter: Optional[str], context: int = DEFAULT_CONTEXT, force: bool = False) -> Optional[Estimate]:
    """Raise a LoadError when the pair needs more memory than this machine has,
    unless `force`. Returns the estimate (None when it cannot be made)."""
    needed = estimate(target, drafter, context)
    if needed is None or force:
        return needed
    have = available_bytes()
    if needed.total > have:
        pair = target + (f" + {drafter}" if drafter else "")
        raise LoadError(
            f"target {target}: {pair} needs about {needed.describe()}, and this machine has "
            f"{have / GB:.1f} GB for it; choose a smaller model or context, or pass force=True "
            f"(--force) to load it anyway"
        )
    return needed
