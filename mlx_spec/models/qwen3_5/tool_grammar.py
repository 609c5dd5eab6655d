"""Qwen3.5 / 3.6's tool calls (Qwen3-Coder's XML) as a Lark grammar in llguidance's dialect,
typed by each tool's JSON schema: what a forced `tool_choice` holds an answer to (constraints/).

As Qwen's template writes a call:

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>

calls apart by a newline; the parameters in the schema's order, the required ones always. A
VALUE is raw text: a string any text up to its `\\n</parameter>\\n` (at most its maxLength; an
enum one of its values), an integer or a number as written, a boolean `true` or `false` (the
template's `True` too), an object or an array as JSON with the template's `tojson` separators
(`, ` and `: `) held to its schema. `<tool_call>` and `</tool_call>` are added tokens, named in
the grammar by id: text cannot spell them.
"""

import json
import re
from typing import Any, Dict, List

from ...errors import SettingsError

MARKERS = ("<tool_call>", "</tool_call>")
END = "\\n</parameter>\\n"
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TERMINALS = """
INTEGER: /-?(0|[1-9][0-9]{0,17})/
NUMBER: /-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,17})?([eE][+-]?[0-9]{1,2})?/
text_value[suffix="\\n</parameter>\\n"]: /(?s:.*)/
"""


def call_rules(tools: List[Dict[str, Any]], tokenizer) -> tuple:
    """({tool name: its call rule}, the Lark rules, the separator between calls)."""
    start, end = (f"<[{i}]>" for i in marker_ids(tokenizer))
    rules, calls = [], {}
    for index, tool in enumerate(tools):
        function = tool["function"]
        schema = function.get("parameters") or {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or [])
        parts = []
        defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
        for key, spec in properties.items():
            part = f"{_literal('<parameter=' + key + '>' + chr(10))} {_value(spec, defs)}"
            parts.append(part if key in required else f"({part})?")
        name = f"call{index}"
        head = _literal("\n<function=" + function["name"] + ">\n")
        rules.append(f'{name}: {start} {head} {" ".join(parts)} "</function>\\n" {end}')
        calls[function["name"]] = name
    bounded = sorted({int(n) for n in re.findall(r"\btext_(\d+)\b", " ".join(rules))})
    rules += [f'text_{n}[suffix="\\n</parameter>\\n"]: /(?s:.{{0,{n}}})/' for n in bounded]
    return calls, "\n".join(rules) + TERMINALS, '"\\n"'


def _value(schema: Any, defs: Dict[str, Any]) -> str:
    """A Lark expression for one parameter's value and the end of its parameter; `defs`: the
    tool's `$defs` (or `definitions`), which a nested schema's references name."""
    if not isinstance(schema, dict):
        return "text_value"
    choices = schema.get("enum") if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if choices:
        return f'({" | ".join(_literal(_as_written(c)) for c in choices)}) "{END}"'
    kind = schema.get("type")
    if kind == "integer":
        return f'INTEGER "{END}"'
    if kind == "number":
        return f'NUMBER "{END}"'
    if kind == "boolean":
        return f'("true" | "false" | "True" | "False") "{END}"'
    if kind in ("object", "array"):
        typed = {**defs, **schema, "x-guidance": JSON_OPTIONS}
        return f'%json {json.dumps(typed, ensure_ascii=False)} "{END}"'
    longest = schema.get("maxLength")
    if kind == "string" and isinstance(longest, int) and not isinstance(longest, bool) and longest >= 0:
        return f'text_{longest}'
    return "text_value"  # a string, a union, or no type: any text


def _as_written(value: Any) -> str:
    """A constant as the template writes it (`| string`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "True" if value else "False"
    return "None" if value is None else json.dumps(value)


def thought_rule(tokenizer) -> tuple:
    """(the Lark expression of Qwen's thought, the rules it needs): with thinking on, the
    generation prompt opens the thought (`<think>\\n`); the model writes it, free, closes it
    with `</think>` and the blank lines before its answer."""
    (end,) = marker_ids(tokenizer, ("</think>",))
    return "thought", f'thought: THOUGHT_TEXT <[{end}]> /[ \\n]*/\nTHOUGHT_TEXT: /(?s:.*)/'


def marker_ids(tokenizer, markers=MARKERS) -> List[int]:
    """The ids of `markers` (`<tool_call>` and `</tool_call>`); a SettingsError where the
    tokenizer lacks one."""
    ids = []
    for marker in markers:
        found = tokenizer.convert_tokens_to_ids(marker) if tokenizer is not None else None
        if not isinstance(found, int) or found == getattr(tokenizer, "unk_token_id", None):
            raise SettingsError(f"the tokenizer has no {marker!r} token: its tool calls cannot be held to a grammar")
        ids.append(found)
    return ids


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
