"""The Responses API's route, `POST /v1/responses` (responses_api.py translates the request,
responses_events.py the answer)."""

from urllib.parse import quote

from fastapi import FastAPI, Request
from pydantic import ValidationError

from .body import described, invalid, parse
from .gate import Gate
from .generation import generation
from .responses_api import ResponsesRequest
from .responses_events import ResponsesFormat
from .schemas import APIError
from .streaming import answer

IGNORED_TOOLS = "x-mlx-spec-ignored-tools"  # tool types left out of the prompt (mlx-spec runs no tools)
# What a header value may hold as it is: printable ASCII but a space and the list's own comma.
# The rest (a tool type in any script, a line break, a space at an end, which h11 refuses) is
# percent-encoded: a header that could not be written failed the answer after it was made.
HEADER_SAFE = "".join(chr(c) for c in range(33, 127) if chr(c) not in ",%")


def ignored_header(response, ignored) -> None:
    """Name the tool types left out of the prompt in the response's header, each once."""
    named = [quote(t, safe=HEADER_SAFE) for t in dict.fromkeys(ignored) if t]
    if named:
        response.headers[IGNORED_TOOLS] = ", ".join(named)


def translated(req):
    """The chat request a dialect's request is, or a 400 naming what could not be translated."""
    try:
        return req.to_chat()
    except ValidationError as e:
        raise invalid(e.errors()) from None
    except ValueError as e:
        raise APIError(400, str(e), code="invalid_value") from None


def ceiling(options):
    """max_output_tokens and max_tokens are ceilings in these dialects (Claude Code asks for
    128,000 whatever the model's context): an answer stops where the context ends, as one
    that reached its ceiling (`incomplete` / `max_tokens`)."""
    return options.but(fit_context=True)


def echo(req: ResponsesRequest) -> dict:
    """The settings a response object repeats."""
    reasoning = {"effort": (req.reasoning or {}).get("effort"), "summary": None} if req.thinking else None
    return {"instructions": req.instructions, "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
            "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
            "reasoning": reasoning}


def add_responses_routes(app: FastAPI, gate: Gate) -> None:
    @app.post("/v1/responses", openapi_extra=ResponsesRequest.openapi_body(gate.names.in_schema),
              responses=described(200, 400, 401, 404, 413, 503, streams=True))
    async def responses(request: Request):
        gate.check_key(request)
        req = await parse(request, ResponsesRequest)
        gate.check_model(req.model)
        chat, ignored = translated(req)
        options = ceiling(chat.options(gate.defaults))
        tokens = await gate.chat_prompt(chat, options)
        form = ResponsesFormat(gate.names.id, echo(req), req.x_report)
        response = await answer(request, gate.worker.submit(generation(tokens, options, chat.active_tools)), form,
                                req.stream)
        ignored_header(response, ignored)
        return response
