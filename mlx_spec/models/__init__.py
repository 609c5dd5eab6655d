"""Model families behind one seam: the registry (registry.py) says how a checkpoint of each
family loads, the protocol (protocol.py) what the loop needs of its target and drafter.

checkpoint.py finds and reads checkpoints (folders, hub ids), cache.py holds the trimmable K/V
caches every family's target can use, traces.py the bounded compiled functions, quantize.py
quantization after loading. gemma4/ is the Gemma 4 family, qwen3_5/ Qwen3.5 and Qwen3.6.
"""

from typing import Any, Tuple

from .checkpoint import Checkpoint, read_checkpoint, resolve
from .gemma4 import FAMILY as GEMMA4
from .qwen3_5 import FAMILY as QWEN3_5
from .registry import Family, Registry, Size

# The families `mlx_spec.load` knows. A caller with a family of its own passes
# `FAMILIES.with_family(...)` to `load`; nothing here changes.
FAMILIES = Registry([GEMMA4, QWEN3_5])


def read(path_or_repo: str, role: str) -> Checkpoint:
    """The checkpoint of a folder or hub id (`role`: "target" or "drafter", for the messages)."""
    return read_checkpoint(resolve(path_or_repo, role), role)


def load_target(path_or_repo: str, registry: Registry = FAMILIES) -> Tuple[Any, Checkpoint]:
    """(target, checkpoint) of a folder or hub id, loaded by its family."""
    checkpoint = read(path_or_repo, "target")
    return registry.family_of(checkpoint, "target").load_target(checkpoint), checkpoint


def load_drafter(path_or_repo: str, quantize_bits=None, quantize_mode=None,
                 registry: Registry = FAMILIES) -> Tuple[Any, Checkpoint]:
    """(draft model, checkpoint) of a folder or hub id, loaded by its family (quantized after
    loading with `quantize_bits` / `quantize_mode`)."""
    checkpoint = read(path_or_repo, "drafter")
    family = registry.family_of(checkpoint, "drafter")
    return family.load_drafter(checkpoint, quantize_bits, quantize_mode), checkpoint


__all__ = ["FAMILIES", "GEMMA4", "QWEN3_5", "Family", "Registry", "Size", "Checkpoint", "read", "load_target", "load_drafter"]
