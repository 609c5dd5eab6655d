"""OpenAI's Responses API (`POST /v1/responses`) as a thin translation at the edge: its request
becomes a chat completion request (schemas.py's `ChatRequest`), which takes the one request
path every route takes; its answer is built from the same events (responses_events.py).

What Codex CLI sends is taken as it comes: the whole conversation in `input` every turn (so
nothing needs storing), `developer` messages beside `instructions`, and tools mlx-spec cannot run
(`web_search`, `local_shell`, `custom`, ...), which are left out of the prompt and named in the
`x-mlx-spec-ignored-tools` header. What exact decoding cannot honour (a forced tool choice, a
JSON format, a stored previous response) is refused by name.
"""

from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from ..media.prompt import PLACE, RETURNED
from ..message_checks import check_schema
from .chat_checks import answers_a_call
from .formats import responses_format, responses_tool_choice
from .json_values import loads, text_field
from .schemas import ChatRequest, Described

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's; any but none turns thinking on
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ResponsesRequest(Described, BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    input: Union[str, List[Dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    max_output_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: Optional[StrictFloat] = Field(None, ge=0)
    top_p: Optional[StrictFloat] = Field(None, gt=0, le=1)
    top_k: Optional[StrictInt] = Field(None, ge=0)  # extension, as on chat completions
    seed: Optional[StrictInt] = Field(None, ge=0, lt=2**64)  # extension
    stream: StrictBool = False
    store: Optional[StrictBool] = None  # nothing is ever stored: the answer says `"store": false`
    reasoning: Optional[Dict[str, Any]] = None  # any effort turns Gemma's thinking on
    previous_response_id: Optional[str] = None
    parallel_tool_calls: Optional[StrictBool] = None
    text: Optional[Dict[str, Any]] = None
    metadata: Optional[Dict[str, Any]] = None
    mtp: Optional[StrictBool] = None  # extension, as on chat completions
    x_report: StrictBool = False  # extension: per-token reports as `x_tokens`

    @model_validator(mode="after")
    def _supported(self):
        if self.previous_response_id is not None:
            raise ValueError("previous_response_id is not supported: this server stores no responses; send the "
                             "whole conversation in input (as Codex does), which the prompt cache resumes")
        responses_format(self.text)  # (checked here, to name the field as this API does)
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input is empty")
        if (self.reasoning or {}).get("effort") not in (None, *EFFORTS):  # (a number turned thinking on)
            raise ValueError(f"reasoning.effort must be one of {', '.join(EFFORTS)}")
        return self

    @property
    def thinking(self) -> Optional[bool]:
        """Any effort turns Gemma's thinking on, "none" off; a `reasoning` without one is OpenAI's
        default effort, medium (Codex sends `{"summary": "auto"}` so); no `reasoning`: the
        server's default."""
        if self.reasoning is None:
            return None
        return self.reasoning.get("effort", "medium") not in (None, "none")

    def function_tools(self) -> Tuple[List[Dict[str, Any]], List[str]]:
        """The function tools as chat tools, and the types of the others (left out of the prompt)."""
        functions, ignored = [], []
        for i, tool in enumerate(self.tools or []):
            if not isinstance(tool, dict):
                raise ValueError(f"tools[{i}] must be an object")
            if tool.get("type") != "function":
                ignored.append(str(tool.get("type")))
                continue
            if not isinstance(tool.get("name"), str) or not tool["name"].strip():
                raise ValueError(f"tools[{i}].name must be a non-empty string")
            if tool.get("parameters") is not None:  # (checked here, to name the field as this API does)
                check_schema(tool["parameters"], f"tools[{i}].parameters")
            function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
            functions.append({"type": "function", "function": function})
        return functions, ignored

    def to_chat(self) -> Tuple[ChatRequest, List[str]]:
        """The chat completion request this one is, and the tool types left out."""
        tools, ignored = self.function_tools()
        body: Dict[str, Any] = {
            "model": self.model, "messages": messages_of(self.instructions, self.input),
            "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "seed": self.seed, "mtp": self.mtp, "x_report": self.x_report,
            "thinking": self.thinking, "stream": self.stream,
            # (a forced choice without function tools goes on, for the chat request to refuse by name)
            "tools": tools or None, "tool_choice": responses_tool_choice(self.tool_choice) if tools or self.tool_choice
            not in (None, "auto", "none") else None,
            "response_format": responses_format(self.text),
        }
        return ChatRequest.model_validate({k: v for k, v in body.items() if v is not None}), ignored


def messages_of(instructions: Optional[str], input: Union[str, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Chat messages for `instructions` and `input`. System and developer text goes into one
    leading system message (Gemma's template takes one); function calls join the assistant
    message before them, a reasoning item the calls after it (the template keeps a tool-calling
    turn's thought); function call outputs become tool messages."""
    system = [instructions] if instructions else []
    out: List[Dict[str, Any]] = []
    reasoning: Optional[str] = None
    images: List[Dict[str, Any]] = []  # of the function call outputs just read (below)
    for i, item in enumerate([{"type": "message", "role": "user", "content": input}] if isinstance(input, str) else input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object")
        kind = item.get("type", "message")
        if images and kind != "function_call_output":
            out.append({"role": "user", "content": images})
            images = []
        if kind == "message":
            role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}")
            content = _content(item.get("content"), where)
            if role != "assistant":  # a new turn: a thought not yet given to a call was its answer's
                reasoning = None
            if role == "system":
                system.append(content if isinstance(content, str) else _text_only(content, where))
            else:
                out.append({"role": role, "content": content})
        elif kind == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out and out[-1]["role"] == "assistant" else None
            if last is None:
                last = {"role": "assistant", "content": ""}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
            if reasoning:
                last["reasoning"], reasoning = reasoning, None
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ValueError(f"{where}.call_id must be a string")
            if not answers_a_call(out, item["call_id"]):
                raise ValueError(f"{where}.call_id {item['call_id']!r} answers no function_call before it")
            text, shown = _output(item.get("output"), where)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
            images += shown
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, where) or reasoning
        else:
            raise ValueError(f"{where}: items of type {kind!r} are not supported (messages, function_call, "
                             "function_call_output and reasoning are)")
    if images:
        out.append({"role": "user", "content": images})
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(s for s in system if s)})
    if not any(m["role"] in ("user", "tool") for m in out):
        raise ValueError("input has no user message or tool output to answer")
    return out


def _content(content: Any, where: str, field: str = "content") -> Union[str, List[Dict[str, Any]]]:
    """A message's content (or a function call's output: `field`) as chat content: a string, or
    text and image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.{field} must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        kind, at = part.get("type") if isinstance(part, dict) else None, f"{where}.{field}[{j}]"
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": text_field(part, "text", at)})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise ValueError(f"{at}: input_image needs image_url (a data URL); file_id is not supported")
            parts.append({"type": "image_url", "image_url": {"url": url}, PLACE: at})
        else:
            raise ValueError(f"{at}: parts of type {kind!r} are not supported (input_text, "
                             "output_text and input_image are)")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output(output: Any, where: str) -> Tuple[str, List[Dict[str, Any]]]:
    """A function call output: its text, and its images (Codex's view_image returns one). Google's
    template writes a tool response's text only, so the images follow the outputs as a user turn
    of their own, which the model sees as it sees any image (a model without a vision tower reads a
    note in its place: media/prompt.py, RETURNED)."""
    content = output if isinstance(output, str) else _content(output, where, "output")
    if isinstance(content, str):
        return content, []
    text = "".join(p["text"] for p in content if p["type"] == "text")
    return text, [{**p, RETURNED: True} for p in content if p["type"] != "text"]


def _text_only(content: Union[str, List[Dict[str, Any]]], where: str) -> str:
    if isinstance(content, str):
        return content
    if any(p["type"] != "text" for p in content):
        raise ValueError(f"{where}: only text is taken here")
    return "".join(p["text"] for p in content)


def _function_call(item: Dict[str, Any], where: str) -> Dict[str, Any]:
    if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
        raise ValueError(f"{where}: a function_call needs name and call_id")
    arguments = item.get("arguments", "{}")
    if isinstance(arguments, str):
        arguments = loads(arguments, f"{where}.arguments", f"{where}.arguments") if arguments.strip() else {}
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}


def _reasoning_text(item: Dict[str, Any], where: str) -> str:
    """The thought a reasoning item gives back (its text, else its summary)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise ValueError(f"{where}: a reasoning item's content and summary must be lists of parts")
    return "".join(text_field(p, "text", f"{where}.content[{j}]") for j, p in enumerate(parts)
                   if isinstance(p, dict) and "text" in p)
