"""Chat sessions that keep the target's caches across turns, and Gemma 4 tool calls.

Each turn renders the whole conversation with the tokenizer's chat template, and only the part
after what the session already holds goes through the target. If the template does not extend
the session's history (some templates rewrite earlier turns), the session starts over from the
full rendering: slower, never wrong.
"""

import json
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from mlx_lm.tool_parsers import gemma4 as gemma4_tools

from .decoder import Decoder, SequenceState, Stats
from .reports import TokenReport

Message = Dict[str, Any]
TOOL_CALL = re.compile(
    re.escape(gemma4_tools.tool_call_start) + r"(.*?)" + re.escape(gemma4_tools.tool_call_end), re.DOTALL
)


def parse_tool_calls(text: str) -> List[Dict[str, Any]]:
    """Tool calls in Gemma 4's `<|tool_call>call:name{...}<tool_call|>` format, as
    [{"name": ..., "arguments": {...}}], parsed with mlx-lm's Gemma 4 parser. A malformed call
    is left out (it stays visible in the text)."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            parsed = gemma4_tools.parse_tool_call(body)
        except ValueError:  # json.JSONDecodeError is a ValueError too
            continue
        calls.extend(parsed if isinstance(parsed, list) else [parsed])
    return calls


def assistant_message(text: str, tool_calls: List[Dict[str, Any]]) -> Message:
    """The model's answer as a chat message (tool calls in the OpenAI-style shape templates use)."""
    message: Message = {"role": "assistant", "content": TOOL_CALL.sub("", text)}
    if tool_calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in tool_calls
        ]
    return message


class ChatSession:
    """A conversation with an `Engine`, its caches kept between turns.

    session = engine.chat(system_prompt="Be brief.", tools=[...])
    for report in session.send("What time is it in Taipei?"): print(report.text, end="")
    session.last_tool_calls  # parsed calls, answer them with session.send(tool_message)
    """

    def __init__(
        self,
        engine,
        system_prompt: Optional[str] = None,
        tools: Optional[List[dict]] = None,
        max_tokens: int = 512,
        **settings,
    ):
        engine._require_tokenizer("a chat session")
        self.engine = engine
        self.system_prompt = system_prompt
        self.tools = tools
        self.max_tokens = max_tokens
        self.settings = settings
        self.last_tool_calls: List[Dict[str, Any]] = []
        self.last_stats: Optional[Stats] = None
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system prompt and tools stay)."""
        self.messages: List[Message] = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        self.state = SequenceState(self.engine.target)
        self.restarts = 0  # turns whose rendering did not extend the history

    def set(self, **settings) -> None:
        """Change decoding settings for the next turns (e.g. mtp=False); the caches stay."""
        self.settings.update(settings)

    def send(
        self,
        message: Union[str, Message],
        max_tokens: Optional[int] = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[TokenReport]:
        """Add a user message (or a message dict, e.g. a tool result) and stream the answer.

        `should_stop` is checked after every token; when it returns True the answer ends there
        and the session stays consistent for the next turn.
        """
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        decoder = self.engine.decoder(**self.settings)
        self.messages.append(message)
        try:
            self._add_turn(decoder)
        except Exception:
            self.messages.pop()
            raise
        # A long answer ends where the model's context does.
        max_tokens = min(max_tokens, self.engine.target.args.max_position_embeddings - len(self.state.tokens))
        reports: List[TokenReport] = []
        stream = self.engine.with_text(decoder.generate(self.state, max_tokens))
        try:
            for report in stream:
                reports.append(report)
                yield report
                if should_stop():
                    break
        finally:
            stream.close()
            text = self.engine.decode([r.token for r in reports])
            self.last_tool_calls = parse_tool_calls(text)
            self.messages.append(assistant_message(text, self.last_tool_calls))
            self.last_stats = decoder.stats

    def _add_turn(self, decoder: Decoder) -> None:
        rendered = self.engine.encode(self.messages, self.tools)
        held = self.state.tokens
        new = rendered[len(held) :] if rendered[: len(held)] == held else None
        if new is None:
            new = self._new_by_text(rendered)
        if new is None or not new:
            # The template rewrote earlier turns: start over from the full rendering.
            self.restarts += 1
            self.state = SequenceState(self.engine.target)
            new = rendered
        decoder.check_room(self.state, len(new), 1)
        decoder.add_tokens(self.state, new)

    def _new_by_text(self, rendered: List[int]) -> Optional[List[int]]:
        """The new turn's tokens when the history, as text, is a prefix of the rendering (the
        model's own tokens may differ from how the template's text re-tokenizes)."""
        tokenizer = self.engine.tokenizer
        held_text = tokenizer.decode(self.state.tokens)
        full_text = tokenizer.decode(rendered)
        if not full_text.startswith(held_text):
            return None
        return list(tokenizer.encode(full_text[len(held_text) :], add_special_tokens=False))


def tool_result(name: str, content: Any) -> Message:
    """A tool's result as a chat message for `ChatSession.send`."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return {"role": "tool", "name": name, "content": text}
