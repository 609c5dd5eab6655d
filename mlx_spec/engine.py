"""The engine: a loaded target, its drafter and tokenizer, and the entry point `load`."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .assistant import Assistant
from .loading import (
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    check_pair,
    load_drafter,
    load_target,
    load_tokenizer,
)
from .target import Target


@dataclass
class Engine:
    target: Target
    drafter: Optional[Assistant]
    tokenizer: Optional[Any]
    target_path: Path
    drafter_path: Optional[Path]


def load(
    model: str = DEFAULT_TARGET,
    drafter: Optional[str] = DEFAULT_DRAFTER,
    drafter_bits: Optional[int] = None,
) -> Engine:
    """Load the Gemma 4 target and (unless `drafter` is None) its MTP assistant.

    `model` and `drafter` are hub repo ids or local folders. `drafter_bits` (4 or 8) quantizes
    the drafter after loading. Raises `LoadError` with a message naming the problem.
    """
    target, target_ckpt = load_target(model)
    assistant, drafter_path = None, None
    if drafter is not None:
        assistant, drafter_ckpt = load_drafter(drafter, quantize_bits=drafter_bits)
        drafter_path = drafter_ckpt.path
        check_pair(target, assistant, drafter_path)
    return Engine(target, assistant, load_tokenizer(target_ckpt), target_ckpt.path, drafter_path)
