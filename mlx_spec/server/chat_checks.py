"""A chat request's messages, checked and put as Google's template reads them (the validators of
schemas.py's ChatRequest call these; its tools are checked as the Python API's are, by
message_checks.py): each wrong shape a ValueError naming where it is, which the request's
parsing answers as a 400."""

from typing import Any, Dict, List

from ..message_checks import ROLES
from .json_values import Refused, loads, text_field

# Text, and media as OpenAI sends them (image_url, input_audio) or as the chat template names them.
PART_TYPES = ("text", "image_url", "input_audio", "image", "audio")


def checked_message(message: Dict[str, Any], index: int) -> Dict[str, Any]:
    """A chat message as Google's template reads it: text content (text parts joined; media parts
    kept, for `Engine.prepare`),
    `developer` as `system`, and tool-call arguments as mappings (OpenAI sends JSON strings,
    which the template would write verbatim inside Gemma's braces)."""
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ValueError(f"messages[{index}] needs a role among {', '.join(ROLES)}")
    out = dict(message)
    if out["role"] == "developer":
        out["role"] = "system"
    content = out.get("content")
    if isinstance(content, list):
        if any(not isinstance(p, dict) or p.get("type") not in PART_TYPES for p in content):
            raise ValueError(f"messages[{index}].content: the parts must be of types {', '.join(PART_TYPES)}")
        texts = {j: text_field(p, "text", f"messages[{index}].content[{j}]") for j, p in enumerate(content)
                 if p["type"] == "text"}
        if len(texts) == len(content):
            out["content"] = "".join(texts.values())
        else:
            out["content"] = [{"type": "text", "text": texts[j]} if j in texts else p for j, p in enumerate(content)]
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"messages[{index}].content must be a string or a list of content parts")
    if out["role"] == "assistant" and out.get("tool_calls"):
        if not isinstance(out["tool_calls"], list):
            raise ValueError(f"messages[{index}].tool_calls must be a list of calls")
        out["tool_calls"] = [_tool_call(c, index) for c in out["tool_calls"]]
    if out["role"] == "tool" and isinstance(out.get("content"), str):
        out["content"] = _json_or_text(out["content"])
    return out


def _tool_call(call: Any, index: int) -> Dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"messages[{index}].tool_calls: each call needs function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str) and arguments.strip():
        where = f"messages[{index}].tool_calls"
        arguments = loads(arguments, where, f"{where}: the arguments string")
    elif isinstance(arguments, str):
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"messages[{index}].tool_calls: arguments must be a JSON object")
    return {**call, "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _json_or_text(content: str) -> Any:
    """A tool result that is a JSON object is rendered natively (`response:NAME{key:value}`);
    anything else, JSON nested too deep for the template included, as the text it is."""
    try:
        value = loads(content, "a tool result", "a tool result")
    except Refused:
        return content
    return value if isinstance(value, dict) else content


def answers_a_call(messages: List[Dict[str, Any]], call_id: str) -> bool:
    """Whether a tool result with `call_id`, put after `messages`, answers a call of the assistant
    message before the tool results they end with (as Google's template matches them: a
    dialect checks it first, to name the fault in its own fields)."""
    for message in reversed(messages):
        if message.get("role") != "tool":
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            return any(isinstance(c, dict) and c.get("id") == call_id for c in calls or [])
    return False
