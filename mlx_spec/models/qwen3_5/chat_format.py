"""Qwen3.5 and Qwen3.6's chat format as the model writes it: a thought between `<think>` and
`</think>`, and tool calls in Qwen3-Coder's XML, typed by the request's tool schemas.

The generation prompt opens the thought itself (`<|im_start|>assistant\\n<think>\\n`) when
thinking is on, and closes an empty one when it is off; so the channel the first generated
token is in is read from the prompt's end. A tool call is written

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

where VALUE is raw text: only the tool's schema says whether `2` is a number or a string
(mlx-lm's qwen3_coder parser reads it so, as vLLM's does).
"""

import json
import re
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mlx_lm.tool_parsers import qwen3_coder

from ...errors import SettingsError
from ..protocol import ANSWER, THOUGHT, TOOL_CALL
from .tool_grammar import call_rules, thought_rule

Message = Dict[str, Any]
THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_BLOCK = re.compile(
    re.escape(qwen3_coder.tool_call_start) + r"(.*?)" + re.escape(qwen3_coder.tool_call_end), re.DOTALL
)


def parse_tool_calls(text: str, tools: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Tool calls in Qwen's XML, as [{"id", "name", "arguments"}], each argument typed by the
    tool's schema in `tools` (a string without one). A block that does not read as a call, or
    whose value its schema's type cannot hold (`2.5` for an integer), is left out."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text):
        try:
            call = qwen3_coder.parse_tool_call(body, tools)
        except (ValueError, SyntaxError, TypeError, OverflowError):  # (1e999 for an integer)
            continue
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", **call})
    return calls


def _token_id(tokenizer, piece: str) -> Optional[int]:
    found = tokenizer.convert_tokens_to_ids(piece) if tokenizer is not None else None
    return found if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None) else None


class Channels:
    """Which channel each generated token is in, and the text it shows there. The markers show
    no text, nor do the newlines the model writes between a thought's end and the answer (the
    template drops them too, reading a thought back)."""

    def __init__(self, tokenizer, prompt: Sequence[int] = ()):
        self.opens = {_token_id(tokenizer, THINK_START): THOUGHT, _token_id(tokenizer, qwen3_coder.tool_call_start): TOOL_CALL}
        self.closes = {_token_id(tokenizer, THINK_END): THOUGHT, _token_id(tokenizer, qwen3_coder.tool_call_end): TOOL_CALL}
        self.opens.pop(None, None)
        self.closes.pop(None, None)
        self.channel, self.after_thought = self._opening_channel(prompt), False

    def _opening_channel(self, prompt: Sequence[int]) -> str:
        """THOUGHT where the prompt ends inside an open thought (thinking on), else ANSWER."""
        for token in reversed(list(prompt)[-8:]):  # the generation prompt's last few tokens
            if self.opens.get(token) == THOUGHT:
                return THOUGHT
            if self.closes.get(token) == THOUGHT:
                return ANSWER
        return ANSWER

    def feed(self, token: int, piece: str) -> Tuple[str, str]:
        """(channel, visible text) of the next generated token."""
        if token in self.opens:
            self.channel = self.opens[token]
            return self.channel, ""
        if token in self.closes:
            channel, self.channel = self.closes[token], ANSWER
            self.after_thought = channel == THOUGHT
            return channel, ""
        if self.after_thought and self.channel == ANSWER:
            piece = piece.lstrip("\n")
            self.after_thought = not piece
        return self.channel, piece


def assistant_message(text: str, tool_calls: List[Dict[str, Any]], thinking: str = "") -> Message:
    """The model's answer as a chat message in the shape Qwen's template reads: its thought as
    `reasoning_content` (the template keeps it within the current turn of tool calls), and the
    calls' arguments as mappings."""
    message: Message = {"role": "assistant", "content": text.strip()}
    if thinking.strip():
        message["reasoning_content"] = thinking.strip()
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in tool_calls
        ]
    return message


def for_template(messages: List[Message]) -> List[Message]:
    """The messages as Qwen's template renders them. Call arguments given as a JSON string (as
    OpenAI clients send them) are read into the mapping the template iterates, and a thought
    given as `reasoning` (as the Responses and Anthropic dialects pass it) is the template's
    `reasoning_content`. What the template
    would refuse with an error from deep inside jinja is a SettingsError naming the message: a
    system message anywhere but first, and a conversation with no user message to answer."""
    out: List[Message] = []
    for index, message in enumerate(messages):
        if message.get("role") == "system" and index != 0:
            raise SettingsError(f"messages[{index}]: Qwen's chat template takes a system message only as the first")
        message = dict(message)
        if "reasoning" in message and "reasoning_content" not in message:  # the server's dialects' name
            message["reasoning_content"] = message.pop("reasoning")
        if message.get("role") == "tool" and isinstance(message.get("content"), dict):
            # The server reads a JSON object result into a mapping (Gemma's template writes one
            # natively); Qwen's writes a result as text.
            message["content"] = json.dumps(message["content"], ensure_ascii=False)
        if message.get("tool_calls"):
            message["tool_calls"] = [_with_mapping_arguments(c, index) for c in message["tool_calls"]]
        out.append(message)
    if not any(m.get("role") == "user" and not _is_tool_response(m.get("content")) for m in out):
        raise SettingsError("Qwen's chat template needs a user message to answer (the conversation has none that is "
                            "not a tool's result)")
    return out


def _is_tool_response(content: Any) -> bool:
    """Whether a user message's text is a tool's result as the template writes one (the template
    does not count it as the user's query)."""
    text = content if isinstance(content, str) else ""
    return text.strip().startswith("<tool_response>") and text.strip().endswith("</tool_response>")


def _with_mapping_arguments(call: Any, index: int) -> Message:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or "name" not in function:
        raise SettingsError(f"messages[{index}]: a tool call must be {{'function': {{'name': ..., 'arguments': ...}}}}, "
                            f"got {call!r}")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise SettingsError(f"messages[{index}]: tool call {function['name']!r} has arguments that are not JSON: "
                                f"{arguments[:80]!r}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise SettingsError(f"messages[{index}]: tool call {function['name']!r} needs its arguments as an object "
                            f"(Qwen's template writes each as a parameter), got {type(arguments).__name__}")
    return {**call, "function": {**function, "arguments": arguments}}


class QwenChatFormat:
    """Qwen3.5's chat format as the engine reads it (models/protocol.py: `ChatFormat`)."""

    for_template = staticmethod(for_template)
    parse_tool_calls = staticmethod(parse_tool_calls)
    assistant_message = staticmethod(assistant_message)
    # Its calls as a Lark grammar typed by the tools' schemas (a forced tool_choice: constraints/tools.py)
    tool_call_rules = staticmethod(call_rules)
    thought_rule = staticmethod(thought_rule)  # its thought, free, before a constrained answer

    @staticmethod
    def channels(tokenizer, prompt: Sequence[int] = ()) -> Channels:
        return Channels(tokenizer, prompt)


CHAT_FORMAT = QwenChatFormat()
