"""A request body, read strictly (json_values.py says what it refuses, before any of it reaches
the schema, the template or the tokenizer). Also here: the schema's errors as OpenAI's error
object, and the error responses the API description lists.
"""

from typing import Dict, List

from fastapi import Request
from pydantic import ValidationError

from .json_values import MAX_DEPTH, Refused, loads
from .schemas import APIError


async def parse(request: Request, model):
    """The body as `model` (a request schema), or an APIError saying what is wrong with it."""
    body = await request.body()
    try:
        data = loads(body, "body", "The request body")
    except Refused as e:
        param = e.where if e.code == "invalid_value" and e.where != "body" else None  # (the value's field)
        raise APIError(400, str(e), param=param, code=e.code) from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise invalid(e.errors()) from None


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


__all__: List[str] = ["parse", "invalid", "described", "MAX_DEPTH"]
