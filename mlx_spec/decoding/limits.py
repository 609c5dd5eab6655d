"""The loop's constants, in one place: how long a draft may be, how far back a sliding-window
cache must be able to go, and how long a prefill chunk is. The options, the decoder, the
sequence state and the memory check read them from here."""

from ..errors import SettingsError
from ..sampling.settings import is_integer

# The most guesses a cycle may verify (the command line's --draft-tokens bound).
MAX_DRAFT_TOKENS = 16
# The longest draft the adaptive length considers (a fixed --draft-tokens may go to MAX_DRAFT_TOKENS).
ADAPTIVE_MAX_G = 8
# How many of its newest positions a sliding-window cache must be able to drop, at any offset.
# While the loop hands over one settled cycle's tokens, the next cycle runs and the one after it
# is queued, each up to g + 1 positions: a caller leaving then takes all three back.
TRIM_ALLOWANCE = 3 * (MAX_DRAFT_TOKENS + 1)
# Prompt tokens put through the target at a time: long prompts in chunks, so that attention's
# scores for one chunk (chunk x context) stay small.
PREFILL_CHUNK = 512


def check_draft_tokens(draft_tokens) -> None:
    """A SettingsError unless `draft_tokens` is None (chosen each cycle) or 0..MAX_DRAFT_TOKENS."""
    if draft_tokens is not None and (not is_integer(draft_tokens) or not 0 <= draft_tokens <= MAX_DRAFT_TOKENS):
        raise SettingsError(f"draft_tokens must be between 0 and {MAX_DRAFT_TOKENS}, got {draft_tokens!r}")
