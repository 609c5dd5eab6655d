"""mlx-spec: exact speculative decoding for Gemma 4 with its MTP drafter, in MLX."""

from .chat import ChatSession, tool_result
from .decoding.prompt_cache import PromptCache
from .decoding.reports import TokenReport
from .decoding.stats import Stats
from .engine import Engine
from .errors import ContextError, LoadError, MediaError, MlxSpecError, PromptStopped, SettingsError
from .generation import Generation, GenerationResult
from .loading import DEFAULT_DRAFTER, DEFAULT_TARGET, load
from .options import Options

__all__ = [
    "load", "Engine", "Options", "Generation", "GenerationResult", "TokenReport", "Stats", "ChatSession",
    "PromptCache", "tool_result", "MlxSpecError", "LoadError", "SettingsError", "ContextError", "MediaError",
    "PromptStopped",
    "DEFAULT_TARGET", "DEFAULT_DRAFTER",
]
__version__ = "0.1.0"
