"""Gemma 4's chat format as the model writes it: thought and tool-call channels, tool calls,
and the messages that carry an answer and a tool's result back into the conversation.

The model writes a thought as `<|channel>thought\\n...<channel|>` and a tool call as
`<|tool_call>call:NAME{key:<|"|>value<|"|>,...}<tool_call|>`, then `<|tool_response>` (a stop
token: the caller runs the tool). Google's template renders the history without the thoughts
(except a tool-calling turn's, passed as `reasoning`), and a tool's result inside the model's
turn, matched to its call by `tool_call_id`.
"""

import json
import math
import re
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mlx_lm.tool_parsers import gemma4 as gemma4_tools

from ...errors import SettingsError
from ..protocol import ANSWER, THOUGHT, TOOL_CALL
from .tool_grammar import call_rules, thought_rule

Message = Dict[str, Any]
CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
TOOL_CALL_BLOCK = re.compile(
    re.escape(gemma4_tools.tool_call_start) + r"(.*?)" + re.escape(gemma4_tools.tool_call_end), re.DOTALL
)


# One call as Google's template writes it in its block: `call:NAME{ARGUMENTS}`.
ONE_CALL = re.compile(r"\s*call:([^{\s]+)(\{.*\})\s*", re.DOTALL)
QUOTED = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.DOTALL)
# A bare key: anything up to its colon but the format's own delimiters. The template writes a
# key as it is (Claude Code's Grep takes `-i` and `-A`; a schema may say `user-id`), where
# mlx-lm's parser quotes \w+ keys only and drops the call.
BARE_KEY = re.compile(r"(?<=[{,])\s*([^\s{}\[\],:\x00][^{}\[\],:\x00]*?)\s*:")


def parse_tool_calls(text: str, tools: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Tool calls in Gemma 4's format, as [{"id", "name", "arguments"}] (typed as written: the
    format quotes strings, so `tools` is not read): each block's call read
    with any key the template writes, else with mlx-lm's Gemma 4 parser (several calls in one
    block). A malformed call is left out, and so is one holding a number JSON cannot carry
    (NaN, Infinity, 1e999: Python's parser reads them, and no client's JSON would)."""
    calls = []
    for body in TOOL_CALL_BLOCK.findall(text):
        try:
            parsed = _one_call(body) or gemma4_tools.parse_tool_call(body)
        except ValueError:  # json.JSONDecodeError is a ValueError too
            continue
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if _finite(call.get("arguments")):
                calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", **call})
    return calls


def _finite(value: Any) -> bool:
    """Whether every number in a parsed JSON value is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _one_call(body: str) -> Optional[Dict[str, Any]]:
    """{"name", "arguments"} of a block holding one call, or None where it holds another shape."""
    match = ONE_CALL.fullmatch(body)
    if match is None:
        return None
    strings: List[str] = []

    def hold(found) -> str:  # the strings out of the way while keys are quoted
        strings.append(found.group(1))
        return f"\x00{len(strings) - 1}\x00"

    arguments = BARE_KEY.sub(lambda m: json.dumps(m.group(1)) + ":", QUOTED.sub(hold, match.group(2)))
    arguments = re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))]), arguments)
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None  # (mlx-lm's parser has its say)
    return {"name": match.group(1), "arguments": parsed} if isinstance(parsed, dict) else None


class Channels:
    """Which channel each generated token is in, and the text it shows there. The markers and
    the thought's `thought\\n` label show no text; a tool call's body shows as written."""

    def __init__(self, tokenizer):
        def token_id(piece: str) -> Optional[int]:
            found = tokenizer.convert_tokens_to_ids(piece) if tokenizer is not None else None
            return found if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None) else None

        self.opens = {token_id(CHANNEL_START): THOUGHT, token_id(gemma4_tools.tool_call_start): TOOL_CALL}
        self.closes = {token_id(CHANNEL_END): THOUGHT, token_id(gemma4_tools.tool_call_end): TOOL_CALL}
        self.opens.pop(None, None)
        self.closes.pop(None, None)
        self.reset()

    def reset(self) -> None:
        self.channel, self.in_label = ANSWER, False

    def feed(self, token: int, piece: str) -> Tuple[str, str]:
        """(channel, visible text) of the next generated token."""
        if token in self.opens:
            self.channel = self.opens[token]
            self.in_label = self.channel == THOUGHT
            return self.channel, ""
        if token in self.closes:
            channel, self.channel, self.in_label = self.closes[token], ANSWER, False
            return channel, ""
        if self.in_label:  # `thought` up to the first newline names the channel
            if "\n" not in piece:
                return self.channel, ""
            self.in_label = False
            piece = piece.split("\n", 1)[1]
        return self.channel, piece


def assistant_message(text: str, tool_calls: List[Dict[str, Any]], thinking: str = "") -> Message:
    """The model's answer as a chat message, in the OpenAI shape Google's template reads. The
    thought goes along only with tool calls (the template keeps it for the turn they continue)."""
    message: Message = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in tool_calls
        ]
        if thinking.strip():
            message["reasoning"] = thinking.strip()
    return message




def for_template(messages: List[Message]) -> List[Message]:
    """The messages as Google's template renders them natively: each tool result moves onto the
    call it answers (`tool_responses`, in order), where a mapping is written
    `response:NAME{key:value}`. (The template's OpenAI path, `role: "tool"` messages, takes
    strings only.) Content given as parts is joined to its text, and call arguments given as a
    JSON string (as OpenAI clients send them) are read into the mapping the template writes.

    An assistant message's words before its calls (a client's echo of a preamble) are left out
    once results follow: the template would write them after the results and end the turn the
    model goes on in.

    A tool result must answer a call of the assistant message before it: by `tool_call_id`
    where it gives one, else by `name`, else the next call not yet answered. One that answers
    no call is a SettingsError naming it, never dropped or put onto another call."""
    out: List[Message] = []
    for index, message in enumerate(messages):
        calls = out[-1].get("tool_calls") if out and out[-1].get("role") == "assistant" else None
        if message.get("role") == "tool":
            if calls and "tool_responses" not in out[-1]:
                # Words before the calls: the template writes a message's words after its results
                # and ends the turn there, which the model continues; it has no place for them.
                out[-1]["content"] = ""
            answered = out[-1].setdefault("tool_responses", []) if calls else None
            call = _answered_call(calls, answered, message, index)
            name = (call.get("function") or {}).get("name") or message.get("name") or "unknown"
            out[-1]["tool_responses"] = [*answered, {"name": name, "response": _text_of_parts(message.get("content"))}]
            continue
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [_with_mapping_arguments(c) for c in message["tool_calls"]]
        out.append(message)
    return out


def _answered_call(calls: Optional[List[Message]], answered: Optional[list], result: Message, index: int) -> Message:
    """The call a tool result answers (see `for_template`)."""
    if not calls:
        raise SettingsError(f"messages[{index}]: a tool result must follow an assistant message with tool_calls")
    wanted = result.get("tool_call_id")
    if wanted is not None:
        for call in calls:
            if call.get("id") == wanted:
                return call
        known = ", ".join(repr(c.get("id")) for c in calls if c.get("id") is not None) or "none"
        raise SettingsError(f"messages[{index}]: tool_call_id {wanted!r} answers no call of the assistant message "
                            f"before it (its call ids: {known})")
    if result.get("name") is not None:
        for call in calls:
            if (call.get("function") or {}).get("name") == result["name"]:
                return call
        raise SettingsError(f"messages[{index}]: no call of the assistant message before it is named {result['name']!r}")
    if len(answered) >= len(calls):
        raise SettingsError(f"messages[{index}]: more tool results than the {len(calls)} call(s) before them")
    return calls[len(answered)]


def _with_mapping_arguments(call: Message) -> Message:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict) or "name" not in call["function"]:
        raise SettingsError(f"a tool call must be {{'function': {{'name': ..., 'arguments': ...}}}}, got {call!r}")
    arguments = call["function"].get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call  # not JSON: the template writes it as it is
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**call["function"], "arguments": parsed}}


def _text_of_parts(content: Any) -> Any:
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content


class Gemma4ChatFormat:
    """Gemma 4's chat format as the engine reads it (models/protocol.py: `ChatFormat`)."""

    for_template = staticmethod(for_template)
    parse_tool_calls = staticmethod(parse_tool_calls)
    assistant_message = staticmethod(assistant_message)
    # Its calls as a Lark grammar typed by the tools' schemas (a forced tool_choice: constraints/tools.py)
    tool_call_rules = staticmethod(call_rules)
    thought_rule = staticmethod(thought_rule)  # its thought, free, before a constrained answer

    @staticmethod
    def channels(tokenizer, prompt: Sequence[int] = ()) -> Channels:
        return Channels(tokenizer)  # (every answer starts in the answer channel: no prompt opens one)


CHAT_FORMAT = Gemma4ChatFormat()
