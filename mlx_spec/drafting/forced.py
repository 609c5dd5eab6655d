"""Guesses a grammar forces: where a constraint allows only one way on (a JSON key, its quotes
and colon, the brace after the last value), llguidance's fast-forward tokens are those tokens.

They are guesses like any other, verified by the target under the constraint's mask, so the
output stays exact; and they are nearly always kept (the model may still spell the same forced
text with other tokens, which its mask allows). So a constrained row with a drafter drafts them
whenever the grammar has some, outside its draft length's choice
(decoding/constrained_rows.py), and its draft length learns nothing from them (decoder.py): they
say nothing of how the assistant guesses. They read the matcher at the row's settled tokens: never drafted ahead of the host.
"""

from typing import List

import mlx.core as mx

from .base import Draft, DraftContext, Drafter

SOURCE = "grammar"


class ForcedTokens(Drafter):
    source = SOURCE

    def __init__(self, matcher):
        """matcher: the row's constraint (constraints/matcher.py), at its settled tokens."""
        self.matcher = matcher

    def tokens(self, most: int) -> List[int]:
        """Up to `most` tokens the grammar forces next."""
        return self.matcher.forced(most) if most > 0 else []

    def draft(self, context: DraftContext, g: int) -> Draft:
        return Draft(mx.array(self.tokens(g), dtype=mx.int32), source=self.source, copied=True)
