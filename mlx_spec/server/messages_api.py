"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a thin
translation at the edge: its request becomes a chat completion request (schemas.py's
`ChatRequest`) that takes the one request path every route takes; its answer is built from the
same events (messages_events.py).

Content blocks map onto chat messages: `text` and `image` blocks onto parts, an assistant's
`tool_use` blocks onto its tool calls and its `thinking` onto the thought Gemma's template keeps
for a tool-calling turn, and the `tool_result` blocks of a user turn onto tool messages before
the rest of that turn. What exact decoding cannot honour (a forced tool choice) is refused by
name.
"""

import json
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from ..media.prompt import PLACE, RETURNED
from ..message_checks import check_schema
from .chat_checks import answers_a_call
from .formats import messages_format, messages_tool_choice
from .json_values import text_field
from .schemas import ChatRequest, Described


class MessagesRequest(Described, BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    messages: List[Dict[str, Any]] = Field(min_length=1)
    system: Optional[Union[str, List[Dict[str, Any]]]] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Dict[str, Any]] = None
    thinking: Optional[Dict[str, Any]] = None
    stop_sequences: Optional[List[str]] = None
    temperature: Optional[StrictFloat] = Field(None, ge=0)
    top_k: Optional[StrictInt] = Field(None, ge=0)
    top_p: Optional[StrictFloat] = Field(None, gt=0, le=1)
    metadata: Optional[Dict[str, Any]] = None
    seed: Optional[StrictInt] = Field(None, ge=0, lt=2**64)  # extension, as on chat completions: a reproducible sample
    mtp: Optional[StrictBool] = None  # extension, as on chat completions
    x_report: StrictBool = False  # extension: per-token reports as `x_tokens`
    output_config: Optional[Dict[str, Any]] = None  # its `format`: the answer's JSON schema
    output_format: Optional[Dict[str, Any]] = None  # the structured-outputs beta's spelling of it

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, value):
        # (a dict, not a model: a nested model would put a $ref in the API description)
        if value is not None and value.get("type") not in ("enabled", "disabled", "adaptive"):
            raise ValueError('thinking.type must be "enabled", "disabled" or "adaptive"')
        budget = (value or {}).get("budget_tokens")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise ValueError("thinking.budget_tokens must be a whole number of tokens")
        return value

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value):
        if any(not s for s in value or []):
            raise ValueError("stop_sequences must not hold empty strings")
        return value

    @model_validator(mode="after")
    def _supported(self):
        messages_tool_choice(self.tool_choice)  # (named as this API names it)
        messages_format(self.output_config, self.output_format)  # (named as this API names it)
        return self

    def function_tools(self) -> Tuple[List[Dict[str, Any]], List[str]]:
        """The client tools as chat tools, and the types of server tools (left out of the prompt:
        mlx-spec runs no tools of its own)."""
        tools, ignored = [], []
        for i, tool in enumerate(self.tools or []):
            if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):
                ignored.append(str(tool["type"]))
            else:
                tools.append(_tool(tool, i))
        return tools, ignored

    def chat_body(self) -> Dict[str, Any]:
        tools, _ = self.function_tools()
        tool_choice = messages_tool_choice(self.tool_choice)
        body = {
            "model": self.model, "messages": messages_of(self.system, self.messages),
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed, "mtp": self.mtp,
            "x_report": self.x_report, "stop": self.stop_sequences or None,
            # no `thinking`: the server's default (`serve --thinking`)
            "thinking": None if self.thinking is None else self.thinking.get("type") in ("enabled", "adaptive"),
            # (a forced choice without tools goes on, for the chat request to refuse by name)
            "tools": tools or None, "tool_choice": tool_choice if tool_choice and (tools or tool_choice != "none") else None,
            "response_format": messages_format(self.output_config, self.output_format),
        }
        return {k: v for k, v in body.items() if v is not None}


class CreateMessage(MessagesRequest):
    max_tokens: StrictInt = Field(ge=1)  # required, as Anthropic's API requires it
    stream: StrictBool = False

    def to_chat(self) -> ChatRequest:
        return ChatRequest.model_validate({**self.chat_body(), "max_tokens": self.max_tokens, "stream": self.stream})


class CountTokens(MessagesRequest):
    def to_chat(self) -> ChatRequest:
        return ChatRequest.model_validate(self.chat_body())


def messages_of(system: Union[None, str, List[Dict[str, Any]]], messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Chat messages for `system` and `messages`. System text, `system` and any `role: "system"`
    message among the turns (Claude Code sends its environment so), goes into one leading
    system message: Gemma's template takes one, first."""
    systems = [_system_text(system)] if system else []
    out: List[Dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant", "system"):
            raise ValueError(f"{where}.role must be user, assistant or system")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise ValueError(f"{where}.content must be a string or a list of content blocks")
        if role == "system":
            systems.append(content if isinstance(content, str) else _text(content, where + ".content"))
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        else:
            out.extend(_assistant(content, where) if role == "assistant" else _user(content, where, out))
    if systems:
        out.insert(0, {"role": "system", "content": "\n\n".join(s for s in systems if s)})
    return out


def _blocks(content: List[Any], where: str):
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValueError(f"{where}.content[{j}] must be a content block with a type")
        yield f"{where}.content[{j}]", block


def _user(content: List[Any], where: str, before: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A user turn: its tool results as tool messages first (they answer the calls before them),
    then its text and images as one user message. A tool result's images (Claude Code's Read of
    an image) go there too: Google's template writes a tool response's text only."""
    results, parts = [], []
    for at, block in _blocks(content, where):
        kind = block["type"]
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise ValueError(f"{at}.tool_use_id must be a string")
            if not answers_a_call(before + results, block["tool_use_id"]):
                raise ValueError(f"{at}.tool_use_id {block['tool_use_id']!r} answers no tool_use block of the "
                                 "assistant turn before it")
            text = block.get("content", "")
            if not isinstance(text, str):
                text, shown = _result(text, at)  # (its blocks: at.content[k])
                parts += shown
            if block.get("is_error"):
                text = json.dumps({"error": text}, ensure_ascii=False)  # rendered `response:NAME{error:...}`
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": text_field(block, "text", at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "document":
            parts.append({"type": "text", "text": _document(block, at)})
        else:
            raise ValueError(f"{at}: blocks of type {kind!r} are not supported in a user turn (text, image, document "
                             "and tool_result are)")
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        results.append({"role": "user", "content": "".join(p["text"] for p in parts) if text_only else parts})
    return results


def _assistant(content: List[Any], where: str) -> List[Dict[str, Any]]:
    message: Dict[str, Any] = {"role": "assistant", "content": ""}
    thought = []
    for at, block in _blocks(content, where):
        kind = block["type"]
        if kind == "text":
            message["content"] += text_field(block, "text", at)
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ValueError(f"{at}: a tool_use block needs id and name")
            arguments = block.get("input") if block.get("input") is not None else {}
            if not isinstance(arguments, dict):
                raise ValueError(f"{at}.input must be an object")
            message.setdefault("tool_calls", []).append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        elif kind == "thinking":
            thought.append(text_field(block, "thinking", at))
        elif kind != "redacted_thinking":  # nothing of ours is ever redacted: no text to give back
            raise ValueError(f"{at}: blocks of type {kind!r} are not supported in an assistant turn (text, "
                             "tool_use and thinking are)")
    if thought and message.get("tool_calls"):
        message["reasoning"] = "".join(thought)
    return [message]


def _image(block: Dict[str, Any], where: str) -> Dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise ValueError(f"{where}.source must be an object")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type") or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{source['data']}"}, PLACE: where}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}, PLACE: where}  # fetched only with --allow-fetch
    raise ValueError(f"{where}.source must be {{type: base64, media_type, data}} or {{type: url, url}}")


def _result(blocks: Any, where: str) -> Tuple[str, List[Dict[str, Any]]]:
    """A tool result's blocks: their text, and their images as chat parts."""
    if not isinstance(blocks, list):
        raise ValueError(f"{where}.content must be a string or a list of text and image blocks")
    texts, images = [], []
    for at, block in _blocks(blocks, where):
        if block["type"] == "text":
            texts.append(text_field(block, "text", at))
        elif block["type"] == "image":  # (a model without a vision tower reads a note: media/prompt.py)
            images.append({**_image(block, at), RETURNED: True})
        elif block["type"] == "document":  # (Claude Code's Read of a PDF)
            texts.append(_document(block, at))
        elif block["type"] == "tool_reference" and isinstance(block.get("tool_name"), str):  # (its ToolSearch)
            texts.append(f"[tool: {block['tool_name']}]")
        else:
            raise ValueError(f"{at}: only text, image, document and tool_reference blocks are taken in a tool result")
    return "".join(texts), images


def _document(block: Dict[str, Any], where: str) -> str:
    """A document block as text: a plain-text document's own text; of another (a PDF), a note
    that it was there. Refused, it was a 400 on every later turn of a Claude Code session that
    had read a PDF, as each turn sends the conversation again (found by a review)."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") not in ("text", "content", "base64", "url", "file"):
        raise ValueError(f"{where}.source must be an object of type text, content, base64, url or file")
    title = block.get("title") if isinstance(block.get("title"), str) else None
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return (f"{title}\n\n" if title else "") + source["data"]
    if source.get("type") == "content" and isinstance(source.get("content"), list):
        return (f"{title}\n\n" if title else "") + _text(source["content"], f"{where}.source")
    kind = source.get("media_type") if isinstance(source.get("media_type"), str) else source.get("type")
    named = f" {title!r}" if title else ""
    return f"[a document{named} ({kind}) is attached here; this model reads no documents of that kind]"


def _text(blocks: Any, where: str) -> str:
    if not isinstance(blocks, list):
        raise ValueError(f"{where} must be a string or a list of text blocks")
    texts = []
    for at, block in _blocks(blocks, where):
        if block["type"] != "text":
            raise ValueError(f"{at}: only text blocks are taken here")
        texts.append(text_field(block, "text", at))
    return "".join(texts)


# Claude Code's first system block: a header for Anthropic's billing, not for the model. Its
# suffix changes with each session, and it comes first: left in, two sessions' prompts part at
# about their 15th token, and every new session went through its whole 30k-token prompt again
# (llama.cpp, vllm-mlx and ollama leave it out too).
BILLING_HEADER = "x-anthropic-billing-header:"


def _system_text(system: Union[str, List[Any]]) -> str:
    if isinstance(system, str):
        return system
    _text(system, "system")  # (checks every block)
    return "".join(b["text"] for b in system if not b["text"].startswith(BILLING_HEADER))


def _tool(tool: Any, index: int) -> Dict[str, Any]:
    """An Anthropic tool ({name, description, input_schema}) as a chat tool."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise ValueError(f"tools[{index}] needs a name")
    check_schema(tool.get("input_schema"), f"tools[{index}].input_schema")  # (required by Anthropic's API)
    if not isinstance(tool.get("description"), (str, type(None))):
        raise ValueError(f"tools[{index}].description must be a string")
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}

