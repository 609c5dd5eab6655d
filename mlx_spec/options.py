"""The settings of one generation, defined and checked once.

Every front end (the Python API, chat sessions, the command line, the server) turns what it was
given into an `Options` and hands it to the one generation path (generation.py). Impossible
values are refused here, by name, before any model work.
"""

from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional, Tuple

from .constraints import Grammar, grammar_of
from .constraints.tools import check_tool_choice
from .decoding.limits import check_draft_tokens
from .errors import SettingsError
from .media.images import SOFT_TOKEN_BUDGETS
from .sampling.settings import SamplingSettings, is_integer


@dataclass(frozen=True)
class Options:
    max_tokens: int = 256  # tokens to generate at most
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: Optional[int] = None  # None: a fresh random seed
    mtp: Optional[bool] = None  # False: the target alone; True: insist on a loaded drafter
    draft_tokens: Optional[int] = None  # guesses per cycle, fixed; None: chosen each cycle
    lookup: bool = True  # prompt-lookup guesses where the text repeats itself
    report: bool = True  # the per-token distribution figures
    thinking: bool = False  # let the model think first (chat prompts)
    stop: Tuple[str, ...] = ()  # end the answer before any of these strings
    # True: a max_tokens the context cannot hold is cut to what it leaves (a chat turn, a server
    # request that named no max_tokens); False: it is refused.
    fit_context: bool = False
    image_tokens: Optional[int] = None  # soft tokens per image (70, 140, 280, 560, 1120); None: the processor's
    # What the answer must be (at most one; constraints/spec.py): a JSON schema (a mapping, its
    # JSON text, or True for any JSON object), a regular expression, or a Lark grammar.
    json_schema: Any = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    # With tools: "auto" (None), "none", "required" (a call of any tool) or a tool's name (a
    # call of it), the calls held to the family's grammar (constraints/tools.py).
    tool_choice: Optional[str] = None
    drafter: Any = field(default=None, compare=False)  # any object with draft(context, g)

    def __post_init__(self):
        self.sampling  # checks temperature, top_k, top_p and seed
        if not is_integer(self.max_tokens) or self.max_tokens < 1:
            raise SettingsError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        check_draft_tokens(self.draft_tokens)
        if self.stop is not None and not isinstance(self.stop, (str, list, tuple)):  # (a dict's keys were taken)
            raise SettingsError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise SettingsError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        object.__setattr__(self, "stop", stop)
        if self.image_tokens is not None and not (is_integer(self.image_tokens) and self.image_tokens in SOFT_TOKEN_BUDGETS):
            raise SettingsError(f"image_tokens must be one of {', '.join(map(str, SOFT_TOKEN_BUDGETS))}, "
                                f"got {self.image_tokens!r}")
        if self.mtp is not None and not isinstance(self.mtp, bool):
            raise SettingsError(f"mtp must be True, False or None, got {self.mtp!r}")
        check_tool_choice(self.tool_choice)
        for name in ("lookup", "report", "thinking", "fit_context"):  # ("no" would be true)
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def constraint(self) -> Optional[Grammar]:
        """The grammar the answer must follow, or None (checks the three settings)."""
        return grammar_of(self.json_schema, self.regex, self.grammar)

    def but(self, **changes) -> "Options":
        """These options with `changes`, checked; an unknown name is a SettingsError."""
        unknown = set(changes) - NAMES
        if unknown:
            raise SettingsError(f"unknown setting {sorted(unknown)[0]!r}; the settings are {', '.join(sorted(NAMES))}")
        return replace(self, **changes) if changes else self


NAMES = frozenset(f.name for f in fields(Options))


def make(options: Optional[Options] = None, **settings) -> Options:
    """`options` (the defaults when None) with the keyword settings applied."""
    if options is not None and not isinstance(options, Options):
        raise SettingsError(f"options must be an Options, got {type(options).__name__}; "
                            "settings may also go by name (max_tokens=..., temperature=...)")
    return (options if options is not None else DEFAULTS).but(**settings)


DEFAULTS = Options()
