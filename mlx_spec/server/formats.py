"""What an answer must be, as each dialect states it: chat completions' `response_format` and
`tool_choice`, the Responses API's `text.format` and `tool_choice`, Anthropic's
`output_config.format` (or the beta's `output_format`) and `tool_choice`. The last two dialects'
become chat completions' (every request here becomes a chat request), and those become
`Options.json_schema` and `Options.tool_choice` (constraints/): the answer held to the schema, or
to calls, drafting still on. A malformed one is a ValueError naming the field (a 400).
"""

from typing import Any, Dict, Optional

from ..options import Options


def chat_json_schema(response_format: Optional[Dict[str, Any]]) -> Any:
    """Options' json_schema for a chat completion's `response_format`: None for text, True for
    `json_object` (any JSON object), the schema for `json_schema`."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return True
    if kind != "json_schema":
        raise ValueError(f'response_format.type must be "text", "json_object" or "json_schema", got {kind!r}')
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError('response_format.json_schema must be an object: {"name": ..., "schema": {...}}')
    return _schema(spec.get("schema"), "response_format.json_schema.schema")


def responses_format(text: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The chat `response_format` for a Responses request's `text.format`."""
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise ValueError('text.format must be an object: {"type": "text"}, {"type": "json_object"} or '
                         '{"type": "json_schema", "name": ..., "schema": {...}}')
    kind = form.get("type")
    if kind in (None, "text", "json_object"):
        return {"type": kind or "text"}
    if kind != "json_schema":
        raise ValueError(f'text.format.type must be "text", "json_object" or "json_schema", got {kind!r}')
    schema = _schema(form.get("schema"), "text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": form.get("name") or "answer", "schema": schema}}


def messages_format(output_config: Optional[Dict[str, Any]], output_format: Optional[Dict[str, Any]]) -> Optional[dict]:
    """The chat `response_format` for a Messages request's `output_config.format` (or the
    structured-outputs beta's `output_format`, the same object)."""
    form = (output_config or {}).get("format") if output_config is not None else None
    where = "output_config.format"
    if form is None and output_format is not None:
        form, where = output_format, "output_format"
    if form is None:
        return None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        raise ValueError(f'{where} must be {{"type": "json_schema", "schema": {{...}}}}')
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": _schema(form.get("schema"), f"{where}.schema")}}


def _schema(schema: Any, where: str) -> dict:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema (an object)")
    Options(json_schema=schema)  # its own checks, named (a SettingsError is a ValueError)
    return schema


def chat_tool_choice(choice: Any) -> Any:
    """Options' tool_choice for a chat completion's: None ("auto"), "none", "required", or the
    name of the function it names."""
    if choice is None or choice in ("auto", "none", "required"):
        return None if choice == "auto" else choice
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError('tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
    return name


def responses_tool_choice(choice: Any) -> Any:
    """The chat tool_choice for a Responses request's (`{"type": "function", "name": ...}`)."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def messages_tool_choice(choice: Optional[Dict[str, Any]]) -> Any:
    """The chat tool_choice for a Messages request's: `any` is "required", `tool` names one."""
    kind = (choice or {}).get("type")
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind not in (None, "auto", "none"):
        raise ValueError('tool_choice.type must be "auto", "any", "tool" or "none"')
    return kind
