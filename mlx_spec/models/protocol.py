"""What the decoding loop needs from a model family: a target behind `TargetModel`, and, for MTP
drafting, a draft model behind `DraftModel`. The loop, the sequence state and the drafters use
nothing else of a model, so a new family implements these two (models/registry.py says how its
checkpoints load).

The target's caches are the family's to make (`make_cache`); they answer the cache interface of
models/cache.py: `offset`, `trim`, and for sliding-window caches `trimmable_to`, `snapshot` and
`restore`, which the sequence state uses to go back in a sequence.
"""

from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    runtime_checkable,
)

import mlx.core as mx

# The channels a generated token can be in (each token's report names one; a chat format's
# `channels` tells them apart): the answer, a thought, a tool call.
ANSWER, THOUGHT, TOOL_CALL = "answer", "thought", "tool_call"


@dataclass
class SharedKV:
    """One attention type's K/V as a drafter reads it: the cache's whole buffer and the range
    of buffer slots that hold settled positions. The buffer's shape changes only when the cache
    grows it (every few hundred tokens), so a compiled draft step masks the range instead of
    slicing it and is not traced again for every new context length. For a cycle built ahead of
    the host the range's ends are device arrays (the running cycle decides where it ends)."""

    keys: mx.array  # [B, H, capacity, D]
    values: mx.array
    lo: Union[int, mx.array]  # first slot read
    hi: Union[int, mx.array]  # one past the last
    # For a batch's rows (models/batch_cache.py): the position each slot holds, [B, capacity];
    # lo and hi [B] are then positions, each row's own.
    held: Optional[mx.array] = None

    def last(self, span: int) -> "SharedKV":
        """The newest `span` positions of this range."""
        if isinstance(self.hi, mx.array) or isinstance(self.lo, mx.array):
            return SharedKV(self.keys, self.values, mx.maximum(self.lo, self.hi - span), self.hi, self.held)
        return SharedKV(self.keys, self.values, max(self.lo, self.hi - span), self.hi)

    def mask(self) -> mx.array:
        """[B, 1, 1, capacity], True where a slot is read (an attention mask for one query)."""
        if self.held is not None:
            return ((self.held >= self.lo[:, None]) & (self.held < self.hi[:, None]))[:, None, None]
        slots = mx.arange(self.keys.shape[-2])
        return ((slots >= self.lo) & (slots < self.hi))[None, None, None]


@runtime_checkable
class TargetModel(Protocol):
    """The model whose output the loop reproduces exactly."""

    model: Any  # its weights (an mlx.nn.Module): wired while it decodes
    vocab_size: int
    hidden_size: int
    context_length: int  # the positions it attends over: prompt and answer together
    traces: Any  # its compiled functions (models/traces.py), owned by the model

    def make_cache(self, max_trim: int) -> List[Any]:
        """Fresh caches; sliding-window ones must drop their newest `max_trim` positions at any offset."""

    def forward(self, tokens: mx.array, cache: List[Any]) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) of every position of `tokens` [1, N], appended to `cache` (a plain
        pass: a sequence's first cycle before its caches hold anything)."""

    def batch_caches(self, max_trim: int, max_pass: int) -> Any:
        """The loop's K/V storage, a row per sequence (models/batch_cache.py's `BatchCaches`
        over `sliding_windows(self.make_cache(max_trim))` serves any mlx-lm model)."""

    def forward_batch(self, tokens: mx.array, caches: Any, offsets: Optional[mx.array] = None) -> Tuple[mx.array, mx.array]:
        """(logits, hidden) [B, L, ...] of every row's tokens, each row at its own offset (on the
        device when given: a step built ahead). models/batch_pass.py's `BatchPass` serves any
        mlx-lm model whose layers use mlx-lm's cache interface."""

    def batch_drafter_buffers(self, caches: Any, end: Optional[mx.array] = None) -> Dict[str, SharedKV]:
        """The K/V an MTP drafter attends to in every row of the storage, the positions each slot
        holds given (empty for a family without an MTP drafter)."""

    def prefill(self, tokens: mx.array, cache: List[Any], chunk: int, spans: Sequence[Any] = (),
                start: int = 0) -> mx.array:
        """Put prompt tokens [1, L] through in chunks; the hidden state [1, 1, H] of the last."""

    def embed(self, tokens: mx.array) -> mx.array:
        """The input embedding a drafter reads, as the first layer sees it."""

    def drafter_buffers(self, cache: List[Any]) -> Dict[str, SharedKV]:
        """The K/V an MTP drafter attends to in a sequence's own caches, all settled (empty for
        a family without an MTP drafter)."""


@runtime_checkable
class DraftModel(Protocol):
    """A multi-token-prediction drafter that reads the target's K/V (drafting/mtp.py drives it)."""

    vocab_size: int

    def kv_inputs(self, kv: Dict[str, SharedKV]) -> Tuple[mx.array, ...]:
        """The arrays one draft step reads out of the target's K/V (whole buffers and masks)."""

    def carry(self, hidden: Any, kv: Tuple[mx.array, ...], steps: int) -> Any:
        """What a round of up to `steps` steps hands its first step: the target's hidden state,
        and whatever else the drafter keeps from step to step (arrays, or a tuple of them)."""

    def step(self, token_embedding: mx.array, carry: Any, kv: Tuple[mx.array, ...],
             position: mx.array) -> Tuple[mx.array, Any]:
        """(h, next carry) for one draft position: h for the logits, the carry for the next step.
        `position`: the last settled token's (held for the round: the drafter places its steps)."""

    def greedy_token(self, h: mx.array) -> mx.array:
        """The argmax token [B, 1] of a state, ties to the lowest id."""

    def full_logits(self, h: mx.array) -> mx.array:
        """Logits over the whole vocabulary (for drafters that sample)."""


@runtime_checkable
class ChatFormat(Protocol):
    """How a family's chat template reads messages and how its model writes answers."""

    def for_template(self, messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The messages as the family's chat template renders them natively."""

    def channels(self, tokenizer: Any, prompt: Sequence[int] = ()) -> Any:
        """A fresh reader of generated tokens: `feed(token, piece) -> (channel, visible text)`, and
        `channel`, the one the next token starts in (so a tool call's block is known to have ended
        at its closing marker; without it, at the next token outside the block). `prompt`: the
        token ids the answer follows (a generation prompt may open a thought itself)."""

    def parse_tool_calls(self, text: str, tools: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
        """The tool calls in an answer's text, as [{"id", "name", "arguments"}]; `tools`: the
        request's declarations (a format that writes values untyped reads their types there)."""

    def assistant_message(self, text: str, tool_calls: List[Dict[str, Any]], thinking: str = "") -> Dict[str, Any]:
        """The model's answer as a chat message for the next turn's history."""
