"""What a request does on the model's thread: the engine's one request path (`Generation`),
turned into the events the server answers with.

`prompt_tokens(...)` renders and tokenizes a request's prompt, and checks that it fits, before
the job reaches the model's thread (the route runs it on a thread of its own), so that a long
prompt holds up no other request. `generation(...)` returns the job for the worker: a function
of (engine, prompt cache, stop, batch) that yields `Started` once the prompt has gone through the
model (errors come before it, so the server can still answer with a status), a `Token` per
token the client may see, WAITING while its row waits for the batch's next step, and `Done`.
`stop()` is asked between the prompt's chunks (the worker runs the other rows' steps there): a
client that leaves during a long prompt stops it at the next chunk. However the job ends
(done, closed at any event, stopped in its prompt), its sequence goes back to the prompt
cache consistent.
"""

import base64
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from ..decoding.reports import WAITING, TokenReport
from ..errors import ContextError, PromptStopped
from ..generation import Generation, tokens_to_generate
from ..media.items import MediaItem, MediaSpan, Prepared
from ..options import Options
from .schemas import APIError


@dataclass
class Started:
    prompt_tokens: int
    cached_tokens: int = 0  # of them, resumed from the prompt cache


@dataclass
class Token:
    report: TokenReport
    token_text: str  # the token's own text (for logprobs), whatever text it shows in the answer
    is_stop: bool  # a stop token: it ends the answer and shows nothing
    bytes_of: Optional[Callable[[int], bytes]] = None  # a token's bytes (logprobs), by id: TextSide.token_bytes


@dataclass
class Done:
    result: Any  # GenerationResult
    finish_reason: str
    text: str  # what the client was sent: up to a stop string, which is left out
    stop_sequence: Optional[str] = None  # the stop string that ended it, if one did


def prompt_tokens(engine, prompt: Any, options: Options, tools: Optional[List[dict]] = None) -> Prepared:
    """The prompt's token ids and media, once it is known to fit the context. A text too long to fit by
    its length alone (more characters than the context's tokens could stand for, with a margin
    of two for normalisation) is refused before it is tokenized, which for megabytes of text
    takes seconds; this bound never refuses a prompt that fits."""
    text = engine.render(prompt, tools, options.thinking)
    if text is not None:
        least = len(text) // (2 * engine.text.longest_token_chars)
        if least >= engine.context_length:
            raise context_exceeded(ContextError(least, options.max_tokens, engine.context_length), at_least=True,
                                   ceiling=options.fit_context)
    prepared = engine.prepare(prompt, tools, options.thinking, options.image_tokens)
    try:
        tokens_to_generate(len(prepared.tokens), options, engine.context_length)
    except ContextError as e:
        raise context_exceeded(e, ceiling=options.fit_context) from None
    return prepared


def generation(prompt: Any, options: Options, tools: Optional[List[dict]] = None, as_written: bool = False):
    """The job for one request (see the module docstring). as_written: the text is the model's
    own (channel markers and labels kept, every channel), as a raw completion returns it."""

    held = {"options": options}  # (`cap` may cut its answer before it runs)

    def work(engine, cache, stop: Callable[[], bool] = lambda: False, batch=None) -> Iterator[Any]:
        answer = Generation(engine, prompt, held["options"], tools=tools, cache=cache, as_written=as_written,
                            stop=stop, batch=batch)
        reports = iter(answer)  # not begun until the first next(): closing it then does nothing
        try:
            try:
                prompt_tokens = answer.start()
            except ContextError as e:
                raise context_exceeded(e, ceiling=held["options"].fit_context) from None
            except PromptStopped:
                return  # the client left: nobody to answer
            # The prompt went through: from here on, the request is answered.
            yield Started(prompt_tokens, answer.decoder.stats.prompt_reused)
            for report in reports:
                if report is WAITING:  # nothing new until the batch's next step
                    yield report
                    continue
                yield Token(report, engine.text.token_text(report.token), report.token in engine.stop_tokens,
                            engine.text.token_bytes)
            yield Done(answer.result, answer.result.finish_reason, answer.text, answer.stops.matched)
        finally:  # closed at any event (the client left): the stream first, then the sequence
            reports.close()
            answer.close()

    # The most positions the request's sequence may reach: what the worker's memory check counts.
    length = len(prompt.tokens if isinstance(prompt, Prepared) else prompt)
    work.positions = length + options.max_tokens

    def cap(positions: int) -> bool:
        """Cut a ceiling's answer (max_tokens in the dialects that take it as one: an answer
        stops where the context ends) where memory holds `positions` of K/V, as at the
        context's end; False where that leaves it no token, or it asked for a length."""
        if not options.fit_context or positions <= length:
            return False
        held["options"] = options.but(max_tokens=min(options.max_tokens, positions - length))
        work.positions = length + held["options"].max_tokens
        return True

    work.cap = cap
    # What a group's other ranks need to make the same job: built only when sent (media arrays
    # are megabytes), on the model's thread; `sendable` says whether it can be.
    work.request = lambda: as_request(prompt, held["options"], tools, as_written)
    work.sendable = options.drafter is None and isinstance(prompt, (Prepared, list))
    work.media_bytes = sum(a.nbytes for s in prompt.spans for a in s.item.arrays) if isinstance(prompt, Prepared) else 0
    return work


def as_request(prompt: Any, options: Options, tools: Optional[List[dict]], as_written: bool) -> Optional[dict]:
    """The request as data (JSON), from which a group's other ranks make the same job
    (`from_request`): its tokens, and its media as the arrays the encoder reads (each rank
    embeds them itself); None where it cannot be (a prompt not yet tokenized, a drafter object)."""
    tokens, spans = (prompt.tokens, prompt.spans) if isinstance(prompt, Prepared) else (prompt, [])
    if not isinstance(tokens, list) or options.drafter is not None:
        return None
    settings = {f.name: getattr(options, f.name) for f in fields(Options) if f.name != "drafter"}
    return {"tokens": [int(t) for t in tokens], "media": [span_data(span) for span in spans],
            "options": dict(settings, stop=list(options.stop)), "tools": tools, "as_written": as_written}


def from_request(request: dict):
    """The job `generation` made of the request `as_request` gave: its media embedded by the
    engine the job runs on."""
    options = Options(**request["options"])

    def work(engine, cache, stop=lambda: False, batch=None):
        # (A generator, as generation's own job: its errors arise where the batch reads it.)
        embed = engine.media.encoder().embed if request["media"] else None
        spans = [MediaSpan(d["start"], item, lambda item=item: embed(item))
                 for d, item in ((d, media_item(d)) for d in request["media"])]
        job = generation(Prepared(request["tokens"], spans), options, request["tools"], request["as_written"])
        yield from job(engine, cache, stop, batch)

    work.positions = len(request["tokens"]) + options.max_tokens
    return work


def span_data(span: MediaSpan) -> dict:
    item = span.item
    return {"start": span.start, "kind": item.kind, "tokens": item.tokens, "digest": item.digest,
            "arrays": [{"dtype": str(a.dtype), "shape": list(a.shape),
                        "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()} for a in item.arrays]}


def media_item(data: dict) -> MediaItem:
    arrays = tuple(np.frombuffer(base64.b64decode(a["data"]), dtype=a["dtype"]).reshape(a["shape"]) for a in data["arrays"])
    return MediaItem(data["kind"], data["tokens"], data["digest"], arrays)


def context_exceeded(e: ContextError, at_least: bool = False, ceiling: bool = False) -> APIError:
    """OpenAI's own words and code for a request that does not fit the context (`at_least`: the
    prompt was measured by its length, not tokenized). `ceiling`: the request's max_tokens is a
    ceiling (Messages, Responses), so only the prompt itself failed to fit: the words name it
    alone (they asked Claude Code to reduce its 32,000-token completion too: a review)."""
    over = "at least " if at_least else ""
    if ceiling:
        words = (f"This model's maximum context length is {e.context} tokens. However, your messages resulted in "
                 f"{over}{e.prompt_tokens} tokens. Please reduce the length of the messages.")
    else:
        words = (f"This model's maximum context length is {e.context} tokens. However, you requested "
                 f"{over}{e.prompt_tokens + e.requested} tokens ({over}{e.prompt_tokens} in the messages, "
                 f"{e.requested} in the completion). Please reduce the length of the messages or completion.")
    return APIError(400, words, param="messages", code="context_length_exceeded")
