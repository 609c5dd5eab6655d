"""A request body, read strictly: JSON that Python's parser accepts but no client should send is
refused with a 400 naming where it is, before any of it reaches the schema, the template or the
tokenizer:
- nesting deeper than MAX_DEPTH (a 100,000-deep array exhausts Python's recursion);
- strings that are not Unicode text (a lone surrogate such as "\\ud800" is valid JSON, but no
  encoder takes it);
- numbers that are not finite (`NaN`, `Infinity`, or `1e400`, which Python reads as infinity).
Also here: the schema's errors as OpenAI's error object, and the error responses the API
description lists.
"""

import json
import math
from typing import Any, Dict, List

from fastapi import Request
from pydantic import ValidationError

from .schemas import APIError

MAX_DEPTH = 64


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotFinite(name)


async def parse(request: Request, model):
    """The body as `model` (a request schema), or an APIError saying what is wrong with it."""
    body = await request.body()
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except _NotFinite as e:
        raise APIError(400, f"Numbers must be finite; the body holds {e}.", code="invalid_value") from None
    except RecursionError:
        raise APIError(400, f"The request body is nested deeper than {MAX_DEPTH} levels.", code="invalid_json") from None
    except ValueError as e:
        raise APIError(400, f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    check_values(data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise invalid(e.errors()) from None


def check_values(data: Any) -> None:
    """Walk the parsed body (without recursion) for what `parse` refuses."""
    stack = [(data, "body", 1)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"The request body is nested deeper than {MAX_DEPTH} levels (at {where}).",
                           code="invalid_json")
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, float) and not math.isfinite(value):
            raise APIError(400, f"{where}: numbers must be finite, got {value}.", param=where, code="invalid_value")
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, where)
                stack.append((item, f"{where}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("unicode_escape").decode()
        raise APIError(400, f"{where}: the string holds {bad} at character {e.start}, a lone surrogate, "
                       "which is not Unicode text.", param=where, code="invalid_value") from None


def invalid(errors) -> APIError:
    first = errors[0]
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
ANTHROPIC_ERROR_BODY = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"type": "string"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
    }},
}
WHY = {200: "The answer (server-sent events when `stream` is true)", 400: "The request is invalid: the message says how",
       401: "A wrong or missing API key", 404: "No such model", 413: "The body is too large",
       503: "Cancelled: the client left or the server is stopping"}


def described(*statuses: int, streams: bool = False, anthropic: bool = False) -> Dict[int, Dict]:
    """The responses of a route for the API description: JSON (or server-sent events, for a
    route that streams) and the dialect's error object (OpenAI's, or Anthropic's) for the errors."""
    out: Dict[int, Dict] = {}
    for status in statuses:
        if status == 200:
            kinds = ["application/json", "text/event-stream"] if streams else ["application/json"]
            out[200] = {"description": WHY[200], "content": {kind: {} for kind in kinds}}
        else:
            schema = ANTHROPIC_ERROR_BODY if anthropic else ERROR_BODY
            out[status] = {"description": WHY[status], "content": {"application/json": {"schema": schema}}}
    return out


__all__: List[str] = ["parse", "check_values", "invalid", "described", "MAX_DEPTH"]
