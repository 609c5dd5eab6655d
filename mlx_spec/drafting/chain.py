"""Several drafters tried in order: the guesses of the first that proposes any."""

from typing import List, Optional, Sequence

from .base import Draft, DraftContext, Drafter
from .pieces import HostWork


class Chain(Drafter):
    """The first member's guesses where it proposes any, else the next member's, and so on; one
    verification pass per cycle either way. The default drafter is Chain([PromptLookup(),
    MTPDrafter(...)]): copied guesses where the text repeats itself, the assistant's elsewhere.

    Ahead of the host, a chain drafts with its members that can (`drafts_ahead`), unless the
    running cycle's guesses came from a member that cannot: where the text matched last cycle
    it likely matches again, and the next cycle waits for the tokens to look them up."""

    def __init__(self, members: Sequence[Drafter]):
        if not members:
            raise ValueError("a chain needs at least one drafter")
        self.members: List[Drafter] = list(members)
        self.drafts_ahead = all(m.drafts_ahead for m in self.members)
        self._ahead = [m for m in self.members if m.drafts_ahead]

    def draft(self, context: DraftContext, g: int) -> Draft:
        for member in self.members[:-1]:
            draft = member.draft(context, g)
            if draft.tokens.size:
                return draft
        return self.members[-1].draft(context, g)

    def draft_steps(self, context: DraftContext, g: int) -> HostWork:
        for member in self.members[:-1]:
            draft = yield from member.draft_steps(context, g)
            if draft.tokens.size:
                return draft
        return (yield from self.members[-1].draft_steps(context, g))

    def begin(self, sequence) -> None:
        for member in self.members:
            member.begin(sequence)

    def accept(self, sequence, tokens: List[int]) -> None:
        for member in self.members:
            member.accept(sequence, tokens)

    def for_ahead(self, last_source: str) -> Optional[Drafter]:
        if self.drafts_ahead:
            return self
        if not self._ahead or any(m.source == last_source for m in self.members if not m.drafts_ahead):
            return None
        return self._ahead[0] if len(self._ahead) == 1 else Chain(self._ahead)
