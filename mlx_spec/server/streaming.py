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


async def answer(request: Request, job, form, stream: bool, include_usage: bool) -> Response:
    events = job.__aiter__()
    watcher = asyncio.ensure_future(watch(request, job))
    try:
        started = await events.__anext__()
        assert isinstance(started, Started), started
        if stream:  # from here on, the streaming response watches the connection itself
            return StreamingResponse(sse(job, events, form, started.prompt_tokens, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        tokens = []
        async for event in events:
            if isinstance(event, Token):
                tokens.append(event)
            elif isinstance(event, Done):
                return JSONResponse(form.completion(started.prompt_tokens, tokens, event))
        return cancelled()
    except (SettingsError, TemplateError) as e:  # impossible settings, messages the template refuses
        raise APIError(400, str(e), code="invalid_value") from None
    except StopAsyncIteration:  # cancelled before it started
        return cancelled()
    except asyncio.CancelledError:  # the server is stopping this request
        job.cancel()
        raise
    finally:
        watcher.cancel()


async def sse(job, events: AsyncIterator, form, prompt_tokens: int, include_usage: bool):
    """Server-sent events: chunks, then `data: [DONE]`. Starlette cancels this generator when
    the client disconnects; the job is cancelled with it and the model is free at once."""
    try:
        for chunk in form.first_chunks():
            yield data(chunk)
        async for event in events:
            if isinstance(event, Token):
                chunk = form.token_chunk(event)
                if chunk is not None:
                    yield data(chunk)
            elif isinstance(event, Done):
                for chunk in form.last_chunks(prompt_tokens, event, include_usage):
                    yield data(chunk)
                yield "data: [DONE]\n\n"
                return
        # Ended without an answer: the server is shutting down.
        yield data(APIError(503, "The server is shutting down.", type="server_error").body())
    except APIError as e:
        yield data(e.body())
    except Exception:  # after the headers, an error can only be told in the stream
        LOG.exception("a streamed answer failed")
        yield data(APIError(500, "generation failed; the server's log has the details", type="server_error").body())
    finally:
        job.cancel()


def cancelled() -> Response:
    error = APIError(503, "The request was cancelled: the client left or the server is shutting down.",
                     type="server_error")
    return JSONResponse(error.body(), status_code=503)


def data(obj: Dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
