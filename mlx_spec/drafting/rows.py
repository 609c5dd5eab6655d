"""Drafting for the rows of a step (decoding/batch.py): each row's own drafter, and the MTP
assistant's steps run once for every row that drafts with it.

A row's drafter is what it would be alone: prompt lookup then the assistant (the default chain),
either alone, or any drafter given. Members that guess on the host (prompt lookup, a custom
drafter) draft row by row; the rows left to one MTP assistant, which guesses argmax, draft
together, each taking as many of the common steps' guesses as it asked for (an assistant told to
sample its guesses drafts argmax here: either rule is exact). A drafter that runs an assistant
inside (the bench's controlled drafter) drafts with the rows of that assistant by naming it its
`batch_group`, and makes each row's draft of the common guesses (`from_batch`). Drafters other
than the assistant see each row's tokens and n-grams, not the K/V (`DraftContext.kv` is empty in
a batch).

The drafting is host work in pieces (a piece per draft step), and each draft step's outputs
are a stage of the step's launch: the loop queues a step a draft step at a time and builds a
piece of the next one in between (decoding/batch.py).
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx

from .base import Draft, DraftContext, Drafter
from .chain import Chain
from .mtp import MTPDrafter
from .pieces import HostWork

Stages = List[List[mx.array]]  # [i]: the outputs of draft step i, every row's


def draft_rows(drafters: List[Optional[Drafter]], contexts: List[Optional[DraftContext]], gs: List[int],
               assistant_inputs: Callable[[List[int]], tuple], free_only: Sequence[bool]) -> HostWork:
    """Each row's draft of up to gs[b] guesses (none where g is 0 or there is no drafter), and
    the draft steps' outputs as stages: returns (drafts, stages). `assistant_inputs(rows)`: the
    MTP assistant's inputs for those rows of the batch (their last tokens, hidden states,
    positions and K/V: `MTPDrafter.draft_batch_steps`). `free_only[b]`: row b drafts with the
    members before its assistant alone (prompt lookup, free to draft), none where they find
    nothing (a probe that asks only whether the text repeats itself: decoding/policy.py)."""
    drafts: List[Optional[Draft]] = [None] * len(gs)
    stages: Stages = []
    together: Dict[int, Tuple[MTPDrafter, List[int]]] = {}  # id(assistant drafter) -> its rows
    last: Dict[int, Drafter] = {}  # row -> the member that drafts it together with others
    for b, (drafter, context, g) in enumerate(zip(drafters, contexts, gs)):
        if drafter is None or g == 0:
            drafts[b] = Draft(mx.zeros((0,), mx.int32), source="none")
            continue
        host, assistant = _split(drafter)
        for member in host:
            draft = yield from member.draft_steps(context, g)
            if draft.tokens.size:
                drafts[b] = draft
                _add_stages(stages, draft.steps)
                break
        else:
            if assistant is None or free_only[b]:
                drafts[b] = Draft(mx.zeros((0,), mx.int32), source=host[-1].source if host else "none")
            else:
                last[b] = assistant
                group = assistant.batch_group
                together.setdefault(id(group), (group, []))[1].append(b)
    for assistant, rows in together.values():
        guesses, steps = yield from assistant.draft_batch_steps(*assistant_inputs(rows), max(gs[b] for b in rows))
        _add_stages(stages, steps)
        for i, b in enumerate(rows):
            drafts[b] = last[b].from_batch(guesses[i, : gs[b]], contexts[b])
    return drafts, stages


def _add_stages(stages: Stages, steps: List[mx.array]) -> None:
    for i, step in enumerate(steps):
        if i == len(stages):
            stages.append([])
        stages[i].append(step)


def _split(drafter: Drafter):
    """(members that draft row by row, the member that ends it and drafts with other rows'
    (its `batch_group`, an MTP assistant) or None)."""
    members = drafter.members if isinstance(drafter, Chain) else [drafter]
    last = members[-1]
    # An assistant that samples its guesses drafts argmax here: both rules are exact, and the
    # batch's steps are argmax ones.
    if getattr(last, "batch_group", None) is not None:
        return members[:-1], last
    return members, None
