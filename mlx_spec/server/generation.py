"""What a request does on the model's thread: encode, fit the context, stream, stop strings.

`generation(...)` returns the job for the worker: a function of (engine, prompt cache) that
yields `Started` once the prompt has gone through the model (errors come before it, so the
server can still answer with a status), a `Token` per token the client may see, and `Done`.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..chat_format import ANSWER
from ..reports import TokenReport
from .schemas import APIError


@dataclass
class Started:
    prompt_tokens: int


@dataclass
class Token:
    report: TokenReport
    piece: str  # the token's own text (for logprobs), whatever text it shows in the answer
    is_stop: bool  # a stop token: it ends the answer and shows nothing


@dataclass
class Done:
    result: Any  # GenerationResult
    finish_reason: str
    text: str  # what the client was sent: up to a stop string, which is left out


class StopStrings:
    """Holds back tokens while their text could still become a stop string; on one, releases
    the text before it and says so. Only text counts (`channels` None: every channel)."""

    def __init__(self, stops: List[str], channels: Optional[Tuple[str, ...]] = (ANSWER,)):
        self.stops, self.channels = stops, channels
        self.longest = max((len(s) for s in stops), default=0)
        self.text = ""
        self.searched = 0  # stop strings cannot start before this
        self.pending: List[Tuple[TokenReport, int, int]] = []  # (report, start, end) in self.text
        self.hit = False

    def feed(self, report: TokenReport) -> List[TokenReport]:
        start = len(self.text)
        if report.text and (self.channels is None or report.channel in self.channels):
            self.text += report.text
        self.pending.append((report, start, len(self.text)))
        if not self.stops:
            return self._release(len(self.text))
        found = [i for i in (self.text.find(s, self.searched) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            return self._cut(min(found))
        held = max((k for k in range(1, min(self.longest, len(self.text) + 1))
                    if any(s.startswith(self.text[-k:]) for s in self.stops)), default=0)
        self.searched = max(self.searched, len(self.text) - self.longest + 1, 0)
        return self._release(len(self.text) - held)

    def flush(self) -> List[TokenReport]:
        return self._release(len(self.text))

    def _release(self, upto: int) -> List[TokenReport]:
        out = []
        while self.pending and self.pending[0][2] <= upto:
            out.append(self.pending.pop(0)[0])
        return out

    def _cut(self, at: int) -> List[TokenReport]:
        out = []
        for report, start, end in self.pending:
            if start > at or (start == at and end > start):  # the stop string's own text, or after it
                break
            out.append(report if end <= at else dataclasses.replace(report, text=report.text[: at - start]))
        self.pending = []
        self.text = self.text[:at]
        return out


def generation(
    prompt: Any,
    *,
    settings: Dict[str, Any],
    max_tokens: Optional[int],
    default_max_tokens: int,
    stops: List[str],
    tools: Optional[List[dict]] = None,
    thinking: bool = False,
    report: bool = False,
    as_written: bool = False,
):
    """The job for one request (see the module docstring). as_written: the text is the model's
    own (channel markers and labels kept, every channel), as a raw completion returns it."""

    def work(engine, cache) -> Iterator[Any]:
        tokens = engine.encode(prompt, tools, thinking)
        limit = fit(len(tokens), max_tokens, default_max_tokens, context_length(engine))
        decoder = engine.decoder(report=report, **settings)
        stream = engine.stream(tokens, max_tokens=limit, decoder=decoder, cache=cache)
        holder = StopStrings(stops, None if as_written else (ANSWER,))
        steps: List[TokenReport] = []
        try:
            for n, step in enumerate(stream):
                if n == 0:  # the prompt went through: from here on, the request is answered
                    yield Started(len(tokens))
                steps.append(step)
                for released in holder.feed(dataclasses.replace(step, text=step.raw) if as_written else step):
                    yield Token(released, engine.piece(released.token), released.token in engine.stop_tokens)
                if holder.hit:
                    break
            for released in holder.flush():
                yield Token(released, engine.piece(released.token), released.token in engine.stop_tokens)
        finally:
            stream.close()  # now, not when collected: the sequence goes back to the cache
        result = engine.result(steps, decoder.stats)
        yield Done(result, "stop" if holder.hit else result.finish_reason, holder.text)

    return work


def context_length(engine) -> int:
    return engine.target.args.max_position_embeddings


def fit(prompt_tokens: int, requested: Optional[int], default: int, context: int) -> int:
    """Tokens to generate: as asked (the prompt and they must fit the context), else the
    server's default, cut to what the context leaves."""
    room = context - prompt_tokens
    if requested is not None and requested > room or room < 1:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + (requested or 1)} tokens ({prompt_tokens} in the messages, "
            f"{requested or 1} in the completion). Please reduce the length of the messages or completion.",
            param="messages", code="context_length_exceeded",
        )
    return requested if requested is not None else min(default, room)
