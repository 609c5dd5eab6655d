"""Prompt lookup: guesses copied from earlier in the text."""

from typing import List

import mlx.core as mx

from .base import Draft, DraftContext, Drafter


class PromptLookup(Drafter):
    """Guesses by copying: find the longest recent n-gram (4 down to 2 tokens) that ends the
    settled text and occurred before, in the prompt or the generated text, and propose what
    followed it. Free to compute, and right whenever the answer copies (a time from a tool
    result, code being edited). Deterministic guesses: no q. The n-grams are indexed with the
    sequence (`SequenceState.ngrams`), so a cycle costs O(new tokens), not O(context). It reads
    the tokens' values: never drafted ahead of the host."""

    source = "lookup"

    def continuation(self, context: DraftContext, g: int) -> List[int]:
        return context.ngrams.continuation(context.tokens, g)

    def draft(self, context: DraftContext, g: int) -> Draft:
        return Draft(mx.array(self.continuation(context, g), dtype=mx.int32), source=self.source, copied=True)
