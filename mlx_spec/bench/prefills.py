"""Each prompt through the target once per table, not once per run.

A table runs the same prompt a dozen times (MTP off, on, the default, warm-ups, cycles timed
alone). Decode speed leaves the prefill out, but on a slow device the prefills were most of a
table's time (a 120-token prompt takes seconds on MLX's CPU backend). So a run resumes the
prompt's sequence from a prompt cache, as a server resumes a conversation: the sequence goes back
to the prompt's mark (`SequenceState.rewind`, exact past the sliding window) and only the
prompt's last token goes through the target again.
"""

from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

from ..decoding.sequence import SequenceState

HELD = 8  # prompts a table alternates between


class Prefills:
    """One sequence per prompt, the least recently used dropped past HELD. (Not the server's
    `PromptCache`: that one starts a new sequence for a prompt shorter than half of what a
    sequence holds, as a new conversation would, and a run's answer may be longer than its
    prompt.)"""

    def __init__(self, engine):
        self.engine = engine
        self.sequences: "OrderedDict[tuple, SequenceState]" = OrderedDict()

    @contextmanager
    def sequence(self, decoder, prompt: Sequence[int], spans=()) -> Iterator[SequenceState]:
        """A sequence holding `prompt` (put through the target by `decoder`), kept after."""
        key = (tuple(prompt), tuple(s.key for s in spans))
        state = self.sequences.pop(key, None) or SequenceState(self.engine.target)
        try:
            decoder.start(state, list(prompt), spans)  # back to the prompt's mark, its last token again
            yield state
        finally:
            self.sequences[key] = state
            while len(self.sequences) > HELD:
                self.sequences.popitem(last=False)


@contextmanager
def prompt_sequence(engine, decoder, prompt, spans=(), prefills: Optional[Prefills] = None) -> Iterator[SequenceState]:
    """The prompt's sequence: resumed from `prefills` where given, else a fresh one."""
    if prefills is not None:
        with prefills.sequence(decoder, prompt, spans) as state:
            yield state
        return
    state = SequenceState(engine.target)
    decoder.add_tokens(state, list(prompt), spans)
    yield state
