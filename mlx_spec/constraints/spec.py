"""What an answer must be, as a request states it: a JSON schema, a regular expression or a Lark
grammar, checked for its type and shape before any model work (`Options` calls `grammar_of`).

Whether the grammar itself is valid is the matcher library's to say, when it is compiled against
the model's tokenizer (matcher.py); its message is passed on by name.
"""

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..errors import SettingsError

KINDS = ("json_schema", "regex", "grammar")


@dataclass(frozen=True)
class Grammar:
    """One constraint: `kind` is one of KINDS; `source` the schema as JSON text, the regular
    expression, or the Lark grammar."""

    kind: str
    source: str


def grammar_of(json_schema: Any = None, regex: Any = None, grammar: Any = None) -> Optional[Grammar]:
    """The constraint these settings ask for (at most one of them), or None.

    json_schema: a mapping, or its JSON text (True: any JSON object, as OpenAI's json_object);
    regex: a regular expression the whole answer matches; grammar: a Lark grammar (its rule
    `start` is the answer)."""
    given = [(k, v) for k, v in zip(KINDS, (json_schema, regex, grammar)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise SettingsError(f"one constraint at a time: {' and '.join(k for k, _ in given)} were both given")
    kind, value = given[0]
    if kind == "json_schema":
        return Grammar(kind, _schema_text(value))
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{kind} must be a non-empty string, got {_shown(value)}")
    return Grammar(kind, value)


ANY_OBJECT = {"type": "object"}


def _schema_text(value: Any) -> str:
    """A JSON schema as JSON text, its keys in the order given (the answer's keys follow it)."""
    if value is True:
        value = ANY_OBJECT
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SettingsError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(value, Mapping):
        raise SettingsError(f"json_schema must be a JSON object (a schema), its JSON text or True, got {_shown(value)}")
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise SettingsError(f"json_schema cannot be written as JSON: {e}") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"
