"""Chat messages and tool declarations checked before the chat template reads them: a wrong
shape is a ValueError naming where it is (the server answers it with a 400, the Python API
raises it as a SettingsError), never an error from inside the template, nor a turn the template
renders empty without a word (content parts of a kind it does not write)."""

from typing import Any, Dict, List

ROLES = ("system", "developer", "user", "assistant", "tool")
# Text, and media as the media side reads them (media/prompt.py). (Google's template also writes
# a `video` part's marker, but no video goes behind it: Gemma 4's processors send frames as images.)
PART_TYPES = ("text", "image", "image_url", "input_image", "audio", "input_audio")


def check_message(message: Any, index: int) -> None:
    """A message the template can render: a dict with a role among ROLES, and content that is a
    string, None, or a list of parts of PART_TYPES (a text part's text a string). A tool's result
    may be any JSON value: a mapping is rendered natively (`response:NAME{key:value}`)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be a message (a dict with a role and content), got {type(message).__name__}")
    if message.get("role") not in ROLES:
        raise ValueError(f"{where} needs a role among {', '.join(ROLES)}, got {message.get('role')!r}")
    content = message.get("content")
    if message["role"] == "tool" or content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of content parts, got {type(content).__name__}")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            got = repr(kind) if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"{where}.content[{j}] must be a part of type {', '.join(PART_TYPES)}, got {got}")
        if kind == "text" and not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{j}].text must be a string")


def check_tools(tools: Any) -> List[Any]:
    """A list of tool declarations (`checked_tool`), or of Python functions, which transformers
    declares from their signatures and docstrings."""
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"tools must be a list of function declarations, got {type(tools).__name__}")
    return [tool if callable(tool) else checked_tool(tool, i) for i, tool in enumerate(tools)]


def checked_tool(tool: Dict[str, Any], index: int) -> Dict[str, Any]:
    """A tool as the template reads it: a function with a name, and parameters that are a JSON
    schema object (see `check_schema`)."""
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise ValueError(f"{where} must be a function declaration: {{'type': 'function', 'function': {{'name': ...}}}}")
    if tool.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be \"function\"")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function must be an object with a name")
    if not isinstance(function.get("name"), str) or not function["name"].strip():
        raise ValueError(f"{where}.function.name must be a non-empty string")
    if "description" in function and not isinstance(function["description"], (str, type(None))):
        raise ValueError(f"{where}.function.description must be a string")
    if function.get("parameters") is not None:
        check_schema(function["parameters"], f"{where}.function.parameters")
    return tool


def check_schema(schema: Any, where: str, nested: bool = False) -> None:
    """A JSON schema as Google's template walks it: an object whose `properties` map names to
    schemas, whose `items` is a schema, `required` a list of names and `type` a string (or a
    list of them). Below the top, what JSON Schema allows and the template renders is taken too,
    as agents send it (an MCP server's tools, passed on unchanged): a schema that is `true` or
    `false`, `items` as a list of schemas (draft 7's tuples) or beside `prefixItems`, and
    `required: true` in a property (draft 3)."""
    if nested and isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object")
    properties = schema.get("properties")
    if properties is not None:
        if not isinstance(properties, dict):
            raise ValueError(f"{where}.properties must map parameter names to schemas")
        for name, value in properties.items():
            check_schema(value, f"{where}.properties.{name}", nested=True)
    for key in ("items", "prefixItems"):
        value = schema.get(key)
        if isinstance(value, list):  # (a tuple's schemas, one per place)
            for j, item in enumerate(value):
                check_schema(item, f"{where}.{key}[{j}]", nested=True)
        elif value is not None:
            check_schema(value, f"{where}.{key}", nested=True)
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)
                                     or nested and isinstance(required, bool)):
        raise ValueError(f"{where}.required must be a list of parameter names")
    kind = schema.get("type")
    if kind is not None and not (isinstance(kind, str) or isinstance(kind, list) and all(isinstance(k, str) for k in kind)):
        raise ValueError(f"{where}.type must be a string")
    if schema.get("enum") is not None and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}.enum must be a list")
