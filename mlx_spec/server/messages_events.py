"""Anthropic's Messages API answer: the `message` object, or its stream of events
(`message_start`; per content block `content_block_start`, its deltas and
`content_block_stop`; `message_delta` with the stop reason and usage; `message_stop`), and
Anthropic's error envelope.

A thought streams as a `thinking` block (`thinking_delta`), the answer as a `text` block.
Tool calls are written in Gemma's own syntax and read once the call has closed, so each comes
as a `tool_use` block after the text, its input in one `input_json_delta`.
"""

import json
import uuid
from typing import Any, Dict, List, Optional

from ..models.protocol import ANSWER, THOUGHT
from .generation import Done, Token
from .chat_objects import x_token

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


def error_body(status: int, message: str) -> Dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def tool_use_block(call: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["name"],
            "input": call["arguments"]}


def stop_reason(done: Done) -> str:
    if done.result.tool_calls:
        return "tool_use"
    if done.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if done.stop_sequence else "end_turn"


def usage(prompt_tokens: int, cached: int, output_tokens: int) -> Dict[str, int]:
    """Anthropic counts the prompt tokens read from the cache apart from the others."""
    return {"input_tokens": prompt_tokens - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": output_tokens}


class MessagesFormat:
    named_events = True  # Anthropic's clients dispatch on the `event:` line
    done_marker = None
    ping_after = 2.0  # seconds a stream waits for its prompt to go through before it pings

    def __init__(self, model: str, report: bool, prompt_tokens: Optional[int] = None):
        self.id, self.model, self.report = f"msg_{uuid.uuid4().hex[:24]}", model, report
        self.prompt_tokens = prompt_tokens  # known before the prompt goes through: the stream may open early
        self.opened = False  # message_start was sent
        self.blocks = 0  # content blocks started so far
        self.open: Optional[str] = None  # the kind of the block being streamed
        self.wrote_text = False  # whether a text block was streamed

    def message(self, content: List[Dict[str, Any]], reason: Optional[str], sequence: Optional[str],
                tokens_usage: Dict[str, int]) -> Dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": tokens_usage}

    def completion(self, prompt_tokens: int, tokens: List[Token], done: Done) -> Dict[str, Any]:
        result, content = done.result, []
        if result.thinking:
            content.append({"type": "thinking", "thinking": result.thinking, "signature": ""})
        if done.text or not result.tool_calls:
            content.append({"type": "text", "text": done.text})
        content.extend(tool_use_block(c) for c in result.tool_calls)
        out = self.message(content, stop_reason(done), done.stop_sequence,
                           usage(prompt_tokens, result.stats.prompt_reused, result.stats.generated_tokens))
        if self.report:
            out["x_tokens"] = [x_token(t) for t in tokens]
        return out

    @staticmethod
    def error_event(error) -> Dict[str, Any]:
        return error_body(error.status, error.message)

    def first_chunks(self, started) -> List[Dict[str, Any]]:
        return self._start_message(started.prompt_tokens, started.cached_tokens)

    def early_chunks(self) -> List[Dict[str, Any]]:
        """What a stream whose prompt is still waiting opens with, before its pings: Anthropic's
        flow begins with message_start (its usage counts no cache yet; message_delta's is whole)."""
        return [] if self.prompt_tokens is None else self._start_message(self.prompt_tokens, 0)

    def _start_message(self, prompt_tokens: int, cached: int) -> List[Dict[str, Any]]:
        if self.opened:
            return []
        self.opened = True
        return [{"type": "message_start", "message": self.message([], None, None, usage(prompt_tokens, cached, 0))}]

    def token_chunks(self, token: Token) -> List[Dict[str, Any]]:
        r = token.report
        if token.is_stop or not r.text or r.channel not in (ANSWER, THOUGHT):
            return []
        kind = "text" if r.channel == ANSWER else "thinking"
        events = [] if self.open == kind else [*self._close(), self._start({"type": kind, kind: "",
                                                                           **({"signature": ""} if kind == "thinking" else {})})]
        self.open = kind
        self.wrote_text = self.wrote_text or kind == "text"
        delta = {"type": "text_delta", "text": r.text} if kind == "text" else {"type": "thinking_delta", "thinking": r.text}
        event = {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}
        if self.report:
            event["x_tokens"] = [x_token(token)]
        return [*events, event]

    def _start(self, block: Dict[str, Any]) -> Dict[str, Any]:
        self.blocks += 1
        return {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}

    def _close(self) -> List[Dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.blocks - 1}]

    def last_chunks(self, prompt_tokens: int, done: Done, include_usage: bool = False) -> List[Dict[str, Any]]:
        events = self._close()
        if not self.wrote_text and not done.result.tool_calls:  # the plain answer's empty text block
            events += [self._start({"type": "text", "text": ""}), {"type": "content_block_stop", "index": self.blocks - 1}]
        for call in done.result.tool_calls:
            block = tool_use_block(call)
            events.append(self._start({**block, "input": {}}))
            events.append({"type": "content_block_delta", "index": self.blocks - 1,
                           "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            events.append({"type": "content_block_stop", "index": self.blocks - 1})
        stats = done.result.stats
        events.append({"type": "message_delta", "delta": {"stop_reason": stop_reason(done), "stop_sequence": done.stop_sequence},
                       "usage": usage(prompt_tokens, stats.prompt_reused, stats.generated_tokens)})
        events.append({"type": "message_stop"})
        return events
