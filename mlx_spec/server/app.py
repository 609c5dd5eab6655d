"""The server's app: its error handlers, the routes of each dialect (OpenAI's chat completions,
completions and models in openai_routes.py, its Responses API in responses_routes.py,
Anthropic's Messages API in messages_routes.py), /health, the page at /, and the API's
description at /openapi.json.

Every failure answers with the dialect's error object (Anthropic's envelope under /v1/messages,
OpenAI's elsewhere) and a 4xx status (5xx only for the server's own faults). A request is parsed and checked by its route (body.py reads it strictly,
gate.py checks its key, model and media and renders its prompt on a thread of its own); then it
is queued for the model (`worker.Worker`) and answered as its job's events come
(streaming.py).
"""

import logging
from importlib import resources
from typing import Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

from .. import __version__
from ..errors import SettingsError
from ..options import Options
from .body import described, invalid
from .gate import Gate
from .messages_events import error_body as anthropic_error
from .messages_routes import MESSAGES, add_messages_routes
from .names import ModelNames
from .openai_routes import add_openai_routes
from .responses_routes import add_responses_routes
from .schemas import APIError
from .worker import Worker

MAX_BODY_BYTES = 16 * 1024 * 1024
LOG = logging.getLogger("mlx_spec.server")
STATIC = resources.files("mlx_spec.server") / "static"  # the page: plain files, no build step


def create_app(worker: Worker, model_id: str, defaults: Options, api_key: Optional[str] = None,
               max_body_bytes: int = MAX_BODY_BYTES, served_names: Sequence[str] = (), allow_files: bool = False,
               allow_fetch: bool = False, any_model: bool = False) -> FastAPI:
    """defaults: the server's settings for what a request leaves out (the command line's).
    served_names: the names clients may ask for (the first is the one answers carry); the
    model's path or hub id, its last part and the family's short name for its size are
    accepted too. allow_files / allow_fetch: whether media parts may name the server's local
    files / http(s) URLs (see media.py). any_model: every model name a request gives reaches
    the served model (agents such as Claude Code ask for names of their own); by default an
    unknown name is a 404."""
    app = FastAPI(title="mlx-spec", version=__version__, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.worker = worker
    names = ModelNames(model_id, served_names, worker.engine, any_name=any_model)
    gate = Gate(worker, names, defaults, api_key, allow_files, allow_fetch, max_body_bytes)
    add_error_handlers(app)

    @app.get("/health", responses={**described(200), 503: {
        "description": "Down: the health body with status \"down\" and why", "content": {"application/json": {}}}})
    async def health():
        """The model and the scheduler (running rows, queue, batch tokens per second, prompt
        cache), the group; a 503 with status "down" and why, once it cannot answer (a lost rank)."""
        status = worker.status()
        body = {"status": "down" if "down" in status else "ok", "model": names.id, **status,
                "group": worker.engine.lockstep.describe()}
        return JSONResponse(body, status_code=503 if "down" in status else 200)

    # HEAD too, for a liveness check (its own route: one operation per method in /openapi.json).
    app.head("/health", include_in_schema=False)(health)

    add_openai_routes(app, gate)
    add_responses_routes(app, gate)
    add_messages_routes(app, gate)

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app


def error_response(path: str, error: APIError) -> JSONResponse:
    """The error in the dialect of the route it answers: Anthropic's envelope under its path."""
    anthropic = path == MESSAGES or path.startswith(MESSAGES + "/")
    body = anthropic_error(error.status, error.message) if anthropic else error.body()
    return JSONResponse(body, status_code=error.status)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(request.url.path, e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        message = "Unknown route" if e.status_code == 404 else str(e.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status_code)
        error = APIError(e.status_code, f"{message}: {request.method} {request.url.path}", code=code)
        response = error_response(request.url.path, error)
        response.headers.update(e.headers or {})  # a 405's Allow
        return response

    @app.exception_handler(SettingsError)
    async def settings_error(request: Request, e: SettingsError):
        # Settings the engine refuses where a route reads them (a temperature under the smallest
        # one, say): the request's fault, worded by the rule it broke.
        return error_response(request.url.path, APIError(400, str(e), code="invalid_value"))

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception):
        LOG.error("%s %s failed", request.method, request.url.path, exc_info=e)
        error = APIError(500, "The server failed on this request; its log has the details.", type="server_error")
        return error_response(request.url.path, error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return error_response(request.url.path, invalid(e.errors()))


class BodyLimit:
    """Refuse request bodies over `max_bytes` (413), by Content-Length or as they arrive."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await too_large(scope.get("path", ""), self.max_bytes)(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise APIError(413, f"The request body is over {self.max_bytes} bytes.", code="request_too_large")
            return message

        await self.app(scope, limited, send)


def too_large(path: str, max_bytes: int) -> Response:
    error = APIError(413, f"The request body is over {max_bytes} bytes.", code="request_too_large")
    return error_response(path, error)
