"""A prompt cache shared by several conversations.

An agent sends the whole conversation again with every request. The cache keeps the sequences
of recent requests (their caches and marks); a new prompt resumes the one it shares the
longest prefix with (the same tokens and media: `SequenceState.rewind`), so only what follows goes through the
target. Memory is bounded: the least recently used sequences go first.
"""

from typing import List, Sequence, Tuple

from ..media.items import MediaSpan
from ..models.protocol import TargetModel
from .sequence import SequenceState


class PromptCache:
    def __init__(self, target: TargetModel, max_bytes: int, max_sequences: int = 16):
        if max_bytes < 0 or max_sequences < 1:
            raise ValueError(f"a prompt cache needs max_bytes >= 0 and max_sequences >= 1, got {max_bytes}, {max_sequences}")
        self.target = target
        self.max_bytes = max_bytes
        self.max_sequences = max_sequences
        self.sequences: List[SequenceState] = []  # least recently used first

    def take(self, tokens: List[int], spans: Sequence[MediaSpan] = ()) -> Tuple[SequenceState, int]:
        """The sequence to decode `tokens` in, and how many of them it already holds. The
        sequence leaves the cache until it is given back.

        A prompt resumes the sequence that can keep the most of it, when that is at least half
        of what the sequence holds (its own conversation going on); otherwise it starts a new
        one, and a conversation that merely shares a system prompt leaves the others intact."""
        resumable = [s.resumable(tokens, spans) for s in self.sequences]
        if resumable and max(resumable) > 0:
            i = resumable.index(max(resumable))
            if 2 * resumable[i] >= len(self.sequences[i].tokens):
                state = self.sequences.pop(i)
                return state, state.rewind(tokens, spans)
        return SequenceState(self.target), 0

    def give_back(self, state: SequenceState) -> None:
        """Keep a sequence (most recently used), then evict the oldest beyond the bounds."""
        if state.tokens:
            self.sequences.append(state)
        while self.sequences and (len(self.sequences) > self.max_sequences or self.nbytes > self.max_bytes):
            self.sequences.pop(0)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.sequences)

    def __len__(self) -> int:
        return len(self.sequences)
