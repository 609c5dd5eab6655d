"""The routes: OpenAI's chat completions, completions and models, /health, the page at /, and
the API's description at /openapi.json.

Every failure answers with OpenAI's error object and a 4xx status (5xx only for the server's
own faults). A request is parsed and checked here (body.py): its JSON, its schema, its prompt
rendered and tokenized on a thread of its own; then it is queued for the model
(`worker.Worker`), and the handler waits for its job's first event (the prompt processed, or an
error still answerable with a status) before it answers.
"""

import asyncio
import json
import logging
import secrets
from importlib import resources
from typing import Any, AsyncIterator, Dict, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

from .. import __version__
from ..errors import SettingsError
from ..options import Options
from .body import described, invalid, parse
from .generation import Done, Started, Token, generation, prompt_tokens
from .media import screen_media
from .names import ModelNames
from .responses import ChatFormat, CompletionFormat
from .schemas import APIError, ChatRequest, CompletionRequest
from .worker import Worker

MAX_BODY_BYTES = 16 * 1024 * 1024
LOG = logging.getLogger("mlx_spec.server")
STATIC = resources.files("mlx_spec.server") / "static"  # the page: plain files, no build step


def create_app(worker: Worker, model_id: str, defaults: Options, api_key: Optional[str] = None,
               max_body_bytes: int = MAX_BODY_BYTES, served_names: Sequence[str] = (), allow_files: bool = False,
               allow_fetch: bool = False) -> FastAPI:
    """defaults: the server's settings for what a request leaves out (the command line's).
    served_names: the names clients may ask for (the first is the one answers carry); the
    model's path or hub id, its last part and the family's short name for its size are
    accepted too. allow_files / allow_fetch: whether media parts may name the server's local
    files / http(s) URLs (see media.py)."""
    app = FastAPI(title="mlx-spec", version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.worker = worker
    names = ModelNames(model_id, served_names, worker.engine)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        message = "Unknown route" if e.status_code == 404 else str(e.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status_code)
        return JSONResponse(APIError(e.status_code, f"{message}: {request.method} {request.url.path}", code=code).body(),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        LOG.error("%s %s failed", request.method, request.url.path, exc_info=e)
        error = APIError(500, "The server failed on this request; its log has the details.", type="server_error")
        return JSONResponse(error.body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return JSONResponse(invalid(e.errors()).body(), status_code=400)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def check_model(name: Optional[str]) -> None:
        if name is not None and name not in names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{names.id}` "
                           f"(also called {', '.join(f'`{n}`' for n in names.aliases) or 'nothing else'}).",
                           param="model", code="model_not_found")

    async def tokens_of(prompt, options: Options, tools=None):
        """The prompt's tokens, on a thread of its own (see `prompt_tokens`)."""
        try:
            return await asyncio.to_thread(prompt_tokens, worker.engine, prompt, options, tools)
        except (SettingsError, TemplateError) as e:  # messages the rules or the template refuse
            raise APIError(400, str(e), code="invalid_value") from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            # The template ran on what the client sent, and failed on it: the request's fault.
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages",
                           code="invalid_value") from None

    @app.get("/health", responses=described(200))
    async def health():
        return {"status": "ok", "model": names.id, **worker.status()}

    @app.get("/v1/models", responses=described(200, 401))
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": [names.card(n) for n in names.listed]}

    @app.get("/v1/models/{name:path}", responses=described(200, 401, 404))
    async def model(name: str, request: Request):
        check_key(request)
        check_model(name)
        return names.card(name)

    @app.post("/v1/chat/completions", openapi_extra=ChatRequest.openapi_body(names.accepted),
              responses=described(200, 400, 401, 404, 413, 503, streams=True))
    async def chat_completions(request: Request):
        check_key(request)
        req = await parse(request, ChatRequest)
        check_model(req.model)
        top = req.top_logprobs or 0
        options = req.options(defaults)
        messages = await asyncio.to_thread(screen_media, req.messages, allow_files, allow_fetch, max_body_bytes)
        tokens = await tokens_of(messages, options, req.active_tools)
        form = ChatFormat(names.id, bool(req.logprobs), top, req.x_report)
        return await answer(request, worker.submit(generation(tokens, options)), form, req.stream, req.include_usage)

    @app.post("/v1/completions", openapi_extra=CompletionRequest.openapi_body(names.accepted),
              responses=described(200, 400, 401, 404, 413, 503, streams=True))
    async def completions(request: Request):
        check_key(request)
        req = await parse(request, CompletionRequest)
        check_model(req.model)
        options = req.options(defaults)
        tokens = await tokens_of(req.prompt, options)
        form = CompletionFormat(names.id, req.logprobs, req.x_report)
        return await answer(request, worker.submit(generation(tokens, options, as_written=True)), form,
                            req.stream, req.include_usage)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


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
        if isinstance(form, ChatFormat):
            yield data(form.first_chunk())
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


class BodyLimit:
    """Refuse request bodies over `max_bytes` (413), by Content-Length or as they arrive."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await too_large(self.max_bytes)(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise APIError(413, f"The request body is over {self.max_bytes} bytes.", code="request_too_large")
            return message

        await self.app(scope, limited, send)


def too_large(max_bytes: int) -> Response:
    error = APIError(413, f"The request body is over {max_bytes} bytes.", code="request_too_large")
    return JSONResponse(error.body(), status_code=413)
