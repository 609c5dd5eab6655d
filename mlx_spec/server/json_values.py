"""JSON values as the server takes them: a request's body, and the JSON its strings hold (a
call's arguments, a tool's result). What Python's parser accepts but no client should send is
refused, naming where it is, before any of it reaches the schema, the template or the tokenizer:
- nesting deeper than MAX_DEPTH (a 100,000-deep array exhausts Python's recursion, and the
  template renders a value recursively: a few hundred levels exhaust it there);
- strings that are not Unicode text (a lone surrogate such as "\\ud800" is valid JSON, but no
  encoder takes it);
- numbers that are not finite (`NaN`, `Infinity`, or `1e400`, which Python reads as infinity).
"""

import json
import math
from typing import Any

MAX_DEPTH = 64


class Refused(ValueError):
    """A value the server does not take: the message says why; `where` is the field, `code` the
    error code (invalid_json for what is not JSON or nests too deep, invalid_value otherwise)."""

    def __init__(self, message: str, where: str, code: str):
        super().__init__(message)
        self.where, self.code = where, code


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotFinite(name)


def loads(text: str, where: str, what: str) -> Any:
    """The JSON value `text` holds (`what` names it in a message, `where` is its field), checked
    as `check` checks it, or Refused."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except _NotFinite as e:
        raise Refused(f"{what} holds {e}, a number that is not finite.", where, "invalid_value") from None
    except RecursionError:
        raise Refused(f"{what} is nested deeper than {MAX_DEPTH} levels.", where, "invalid_json") from None
    except ValueError as e:
        raise Refused(f"{what} is not valid JSON: {e}", where, "invalid_json") from None
    check(value, where, what)
    return value


def text_field(block: dict, key: str, where: str) -> str:
    """A block's text (`key`), which must be a string: never Python's text of null or an object."""
    if key not in block:
        raise ValueError(f"{where} needs {key}, a string")
    value = block[key]
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string, got {JSON_TYPES.get(type(value), type(value).__name__)}")
    return value


JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "an array"}


def check(data: Any, where: str, what: str) -> None:
    """Walk a parsed value (without recursion) for what the server refuses."""
    stack = [(data, where, 1)]
    while stack:
        value, at, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(f"{what} is nested deeper than {MAX_DEPTH} levels (at {at}).", at, "invalid_json")
        if isinstance(value, str):
            _check_text(value, at)
        elif isinstance(value, float) and not math.isfinite(value):
            raise Refused(f"{at}: numbers must be finite, got {value}.", at, "invalid_value")
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, at)
                stack.append((item, f"{at}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{at}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("unicode_escape").decode()
        raise Refused(f"{where}: the string holds {bad} at character {e.start}, a lone surrogate, "
                      "which is not Unicode text.", where, "invalid_value") from None
