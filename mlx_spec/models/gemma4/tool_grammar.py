"""Gemma 4's tool calls as a Lark grammar (llguidance's dialect), typed by each tool's JSON schema:
what a forced `tool_choice` holds an answer to (constraints/).

A call is written `<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`, as Google's template writes
one: keys bare, sorted by name as its `dictsort` sorts them (required ones always, any others),
strings between `<|"|>` tokens, numbers, booleans and null bare, arrays and nested objects in
brackets and braces. A schema's types, enums, constants, unions and string lengths hold; what a
schema says beyond them (bounds, patterns, references) falls back to any value of the format. The
format's marker tokens are special tokens, named in the grammar by id (`<[48]>`): text cannot
spell them.
"""

import json
from typing import Any, Dict, List, Optional

from ...errors import SettingsError

MARKERS = ("<|tool_call>", "<tool_call|>", '<|"|>')
CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
DEPTH = 6  # schema levels typed; deeper ones take any value of the format
# Properties of one object typed key by key: its rule grows with their square (any subset in
# order), so a larger object takes any keys of the format. Numbers: at most 18 digits and a
# two-digit exponent, which every parser reads back (a float's range ends near 1e308).
MOST_KEYS = 32
GENERIC = """
value: str | NUMBER | "true" | "false" | "null" | array | object
array: "[" (value ("," value)*)? "]"
object: "{" (pair ("," pair)*)? "}"
pair: KEY ":" value
str: QUOTE TEXT QUOTE
KEY: /[^\\s{}\\[\\],:]+/
TEXT: /(?s:.*)/
NUMBER: /-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,17})?([eE][+-]?[0-9]{1,2})?/
INTEGER: /-?(0|[1-9][0-9]{0,17})/
"""


def call_rules(tools: List[Dict[str, Any]], tokenizer) -> tuple:
    """({tool name: its call rule's name}, the Lark rules every call needs, the separator between
    calls: none), the marker tokens read from `tokenizer`."""
    ids = marker_ids(tokenizer)
    builder = _Builder(ids)
    calls = {}
    for tool in tools:
        function = tool["function"]
        arguments = builder.value(function.get("parameters") or {"type": "object"}, 0)
        start, end = (f"<[{ids[m]}]>" for m in MARKERS[:2])
        calls[function["name"]] = builder.rule(f'{start} {_literal("call:" + function["name"])} {arguments} {end}')
    return calls, builder.text(), ""


class _Builder:
    def __init__(self, ids: Dict[str, int]):
        self.quote = f"<[{ids[MARKERS[2]]}]>"
        self.rules: List[str] = []
        self.terminals: Dict[int, str] = {}

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def text(self) -> str:
        generic = GENERIC.replace("QUOTE", self.quote)
        return "\n".join([*self.rules, *self.terminals.values(), generic])

    def value(self, schema: Any, depth: int) -> str:
        """A Lark expression for one value of `schema`."""
        if not isinstance(schema, dict) or depth > DEPTH:
            return "value"
        if "const" in schema:
            return self._constant(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.rule(" | ".join(self._constant(v) for v in schema["enum"]))
        union = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(union, list) and union:
            return self.rule(" | ".join(self.value(s, depth + 1) for s in union))
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return self.rule(" | ".join(self.value({**schema, "type": k}, depth + 1) for k in kind))
        return self._typed(kind, schema, depth)

    def _typed(self, kind: Optional[str], schema: Dict[str, Any], depth: int) -> str:
        if kind == "string":
            return f"{self.quote} {self._text(schema.get('maxLength'))} {self.quote}"
        if kind == "integer":
            return "INTEGER"
        if kind == "number":
            return "NUMBER"
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            item = self.value(schema.get("items"), depth + 1) if isinstance(schema.get("items"), dict) else "value"
            return self.rule(f'"[" ({item} ("," {item})*)? "]"')
        if kind == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
            return self._object(schema, depth)
        return "value" if kind != "object" else "object"

    def _object(self, schema: Dict[str, Any], depth: int) -> str:
        """The properties in the order Google's template writes them (`dictsort`: by name, case
        aside), each required one always, any other or none; an object without a required one
        may be empty."""
        properties = schema["properties"]
        if len(properties) > MOST_KEYS:
            return "object"
        required = set(schema.get("required") or [])
        keys = sorted(properties, key=lambda k: (k.lower(), k))
        pair = {k: f"{_literal(k + ':')} {self.value(properties[k], depth + 1)}" for k in keys}

        def tail(after: int) -> str:  # every key after this one, each with its comma
            return "".join(f' "," {pair[k]}' if k in required else f' ("," {pair[k]})?' for k in keys[after + 1:])

        first_required = next((i for i, k in enumerate(keys) if k in required), len(keys) - 1)
        starts = [f"({pair[k]}{tail(i)})" for i, k in enumerate(keys[: first_required + 1])]
        body = " | ".join(starts)
        return self.rule(f'"{{" ({body}) "}}"' if required else f'"{{" ({body})? "}}"')

    def _constant(self, value: Any) -> str:
        if isinstance(value, str):
            return f"{self.quote} {_literal(value)} {self.quote}" if value else f"{self.quote} {self.quote}"
        return _literal(json.dumps(value, separators=(",", ":")))

    def _text(self, longest: Any) -> str:
        if not isinstance(longest, int) or isinstance(longest, bool) or longest < 0:
            return "TEXT"
        name = f"TEXT_{longest}"
        self.terminals[longest] = f"{name}: /(?s:.{{0,{longest}}})/"
        return name


def thought_rule(tokenizer) -> tuple:
    """(the Lark expression of Gemma 4's thought, the rules it needs): with thinking on, the model
    may open its thought channel first, `<|channel>thought\\n...<channel|>`, free, before what
    is held."""
    ids = marker_ids(tokenizer, (CHANNEL_START, CHANNEL_END))
    start, end = (f"<[{ids[m]}]>" for m in (CHANNEL_START, CHANNEL_END))
    return "thought?", f"thought: {start} THOUGHT_TEXT {end}\nTHOUGHT_TEXT: /(?s:.*)/"


def marker_ids(tokenizer, markers=MARKERS) -> Dict[str, int]:
    """The ids of the format's marker tokens; a SettingsError where the tokenizer lacks one."""
    ids = {}
    for marker in markers:
        found = tokenizer.convert_tokens_to_ids(marker) if tokenizer is not None else None
        if not isinstance(found, int) or found == getattr(tokenizer, "unk_token_id", None):
            raise SettingsError(f"the tokenizer has no {marker!r} token: its tool calls cannot be held to a grammar")
        ids[marker] = found
    return ids


def _literal(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)
