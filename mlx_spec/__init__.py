"""mlx-spec: exact speculative decoding for Gemma 4 with its MTP drafter, in MLX."""

from .chat_format import tool_result
from .engine import Engine, GenerationResult, load
from .loading import DEFAULT_DRAFTER, DEFAULT_TARGET, LoadError
from .prompt_cache import PromptCache
from .sampling import SettingsError

__all__ = [
    "load", "Engine", "GenerationResult", "PromptCache", "tool_result", "LoadError", "SettingsError",
    "DEFAULT_TARGET", "DEFAULT_DRAFTER",
]
__version__ = "0.1.0"
