"""mlx-spec: exact speculative decoding for Gemma 4 with its MTP drafter, in MLX."""

from .chat_format import tool_result
from .engine import Engine, load
from .generation import ContextError, Generation, GenerationResult
from .loading import DEFAULT_DRAFTER, DEFAULT_TARGET, LoadError
from .options import Options
from .prompt_cache import PromptCache
from .sampling import SettingsError

__all__ = [
    "load", "Engine", "Options", "Generation", "GenerationResult", "PromptCache", "tool_result", "LoadError",
    "SettingsError", "ContextError",
    "DEFAULT_TARGET", "DEFAULT_DRAFTER",
]
__version__ = "0.1.0"
