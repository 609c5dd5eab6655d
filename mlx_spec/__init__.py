"""mlx-spec: exact speculative decoding for Gemma 4 with its MTP drafter, in MLX."""

from .engine import Engine, load
from .loading import DEFAULT_DRAFTER, DEFAULT_TARGET, LoadError

__all__ = ["load", "Engine", "LoadError", "DEFAULT_TARGET", "DEFAULT_DRAFTER"]
__version__ = "0.1.0"
