"""The constrained rows of a step (constraints/, docs/structured-output.md): the guesses their
grammars force, their masks along their guesses, and the guesses their matchers could walk.

A constrained row's step is built from its settled tokens (batch_step.py never builds it ahead):
its matcher stands at them, so its forced tokens and its masks follow what it settled.
"""

import dataclasses
from typing import List

import mlx.core as mx

from ..drafting import Draft
from ..errors import MlxSpecError


def forced_guesses(rows, asks, gs: List[int], drafters: list) -> List[int]:
    """A row whose grammar forces tokens drafts them (drafting/forced.py), whatever its draft
    length chose, which is withdrawn; gs and drafters are changed in place. Returns what each
    row's draft length chose (0 for these rows: the choice was not theirs)."""
    asked = list(gs)
    for b, (row, ask) in enumerate(zip(rows, asks)):
        forced = row.decoder.forced
        if forced is None or drafters[b] is None or ask.budget <= 0:
            continue
        n = len(forced.tokens(row.decoder.policy.cap(ask.budget)))
        if n:
            if gs[b]:
                row.decoder.policy.withdraw()
            gs[b], asked[b], drafters[b] = n, 0, forced
    return asked


def masks_of(rows, drafts, stepping: List[int], positions: int) -> dict:
    """{row index: (its constraint's allowed tokens [positions, words], how many of its guesses
    may be kept)} for the constrained rows that step. Their guesses are read on the host first
    (one sync for all of them). A row whose grammar fails here (one of the matcher's limits) ends
    with that error, alone: it is taken out of `stepping` and sits the step out."""
    constrained = [b for b in stepping if rows[b].decoder.constraint is not None]
    guessing = [b for b in constrained if drafts[b].tokens.size]
    if guessing:  # a host sync more in their cycle: the guesses are read before the pass is built
        mx.eval([drafts[b].tokens for b in guessing])
        for b in guessing:
            rows[b].decoder.stats.host_syncs += 1
    masks = {}
    for b in constrained:
        try:
            masks[b] = rows[b].decoder.builder.mask(drafts[b].tokens, positions)
        except MlxSpecError as e:
            rows[b].error, rows[b].done = e, True
            stepping.remove(b)
    return masks


def walkable_draft(draft: Draft, usable: int) -> Draft:
    """The draft as far as a constraint's matcher could walk it: where it failed walking a guess,
    no guess from that one on may be kept. Kept by match, they become -1 (which no token equals:
    the target draws its own token there, from the last mask the walk reached); sampled (the
    ratio rule), the draft ends before them, so that the token there is the target's own draw
    rather than a correction."""
    g = draft.tokens.shape[0]
    if usable >= g:
        return draft
    if draft.q is not None:
        return dataclasses.replace(draft, tokens=draft.tokens[:usable], q=draft.q[:usable])
    tokens = mx.where(mx.arange(g) < usable, draft.tokens.astype(mx.int32), -1)
    return dataclasses.replace(draft, tokens=tokens)
