"""A job's events as an HTTP answer: one JSON body, or server-sent events as they come.

The handler waits for the job's first event (the prompt processed, or an error still answerable
with a status) before it answers. Until the response starts, a watcher cancels the job when the
client leaves; after it, the streaming response's own cancellation does.
"""

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Dict

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError

from ..errors import SettingsError
from .generation import Done, Started, Token
from .schemas import APIError

LOG = logging.getLogger("mlx_spec.server")


async def watch(request: Request, job) -> None:
    """Cancel the job when the client leaves (until the response starts)."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    job.cancel()


async def answer(request: Request, job, form, stream: bool, include_usage: bool = False) -> Response:
    """The job's answer in `form` (a dialect's: chat, completion, responses, messages). A form
    gives `first_chunks(started)`, `token_chunks(token)`, `last_chunks(prompt_tokens, done,
    include_usage)`, `completion(prompt_tokens, tokens, done)` and `error_event(error)`; it says
    whether events are named (`event:` lines), what ends a stream (`done_marker`) and how long a
    stream may wait for the prompt before it opens with pings (`ping_after`, seconds or None)."""
    events = job.__aiter__()
    watcher = asyncio.ensure_future(watch(request, job))
    first = asyncio.ensure_future(events.__anext__())
    try:
        if stream and getattr(form, "ping_after", None):
            finished, _ = await asyncio.wait({first}, timeout=form.ping_after)
            if not finished:  # a long prompt: open the stream now and keep it alive until it is in
                return stream_response(pinged(job, first, events, form, include_usage))
        started = await first
        assert isinstance(started, Started), started
        if stream:  # from here on, the streaming response watches the connection itself
            return stream_response(sse(job, events, form, started, include_usage))
        tokens = []
        async for event in events:
            if isinstance(event, Token):
                tokens.append(event)
            elif isinstance(event, Done):
                return JSONResponse(form.completion(started.prompt_tokens, tokens, event))
        raise cancelled()
    except (SettingsError, TemplateError) as e:  # impossible settings, messages the template refuse
        raise APIError(400, str(e), code="invalid_value") from None
    except StopAsyncIteration:  # cancelled before it started
        raise cancelled()
    except asyncio.CancelledError:  # the server is stopping this request
        job.cancel()
        raise
    finally:
        watcher.cancel()


def stream_response(body) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def pinged(job, first, events: AsyncIterator, form, include_usage: bool):
    """A stream opened before the prompt is in: pings until it is, then the answer. From its
    first ping the stream is the job's only watcher, so whatever ends it before the answer
    starts (the client left, an error) cancels the job: a request still waiting for a row, or
    in its prompt, would otherwise run to its last token for nobody, holding a row and its K/V."""
    started = None
    try:
        for chunk in getattr(form, "early_chunks", list)():  # (a dialect whose streams open before pings)
            yield encode(form, chunk)
        while True:
            finished, _ = await asyncio.wait({first}, timeout=form.ping_after)
            if finished:
                break
            yield encode(form, {"type": "ping"})
        started = first.result()
    except StopAsyncIteration:
        return
    except (SettingsError, TemplateError, APIError) as e:
        error = e if isinstance(e, APIError) else APIError(400, str(e), code="invalid_value")
        yield encode(form, form.error_event(error))
        return
    except Exception:  # after the headers, an error can only be told in the stream
        LOG.exception("a streamed prompt failed")
        yield encode(form, form.error_event(failed()))
        return
    finally:
        if started is None:
            first.cancel()
            job.cancel()
    async for chunk in sse(job, events, form, started, include_usage):
        yield chunk


async def sse(job, events: AsyncIterator, form, started: Started, include_usage: bool):
    """Server-sent events: the form's chunks, then its end marker. Starlette cancels this
    generator when the client disconnects; the job is cancelled with it and the model is free
    at once."""
    done = False
    try:
        for chunk in form.first_chunks(started):
            yield encode(form, chunk)
        async for event in events:
            if isinstance(event, Token):
                for chunk in form.token_chunks(event):
                    yield encode(form, chunk)
            elif isinstance(event, Done):
                done = True  # (the answer is whole: the job is not cancelled, nor counted dropped)
                for chunk in form.last_chunks(started.prompt_tokens, event, include_usage):
                    yield encode(form, chunk)
                if form.done_marker:
                    yield f"data: {form.done_marker}\n\n"
                return
        # Ended without an answer: the server is shutting down.
        yield encode(form, form.error_event(APIError(503, "The server is shutting down.", type="server_error")))
    except APIError as e:
        yield encode(form, form.error_event(e))
    except Exception:  # after the headers, an error can only be told in the stream
        LOG.exception("a streamed answer failed")
        yield encode(form, form.error_event(failed()))
    finally:
        if not done:
            job.cancel()


def failed() -> APIError:
    return APIError(500, "generation failed; the server's log has the details", type="server_error")


def cancelled() -> APIError:
    """Raised, the app answers it in the route's dialect (a stream's error event is not a body)."""
    return APIError(503, "The request was cancelled: the client left or the server is shutting down.",
                    type="server_error")


def encode(form, obj: Dict[str, Any]) -> str:
    """One event: `data: JSON`, after an `event: TYPE` line where the dialect names its events."""
    line = f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
    return f"event: {obj.get('type', 'error')}\n{line}" if form.named_events else line
