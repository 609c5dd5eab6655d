"""OpenAI response objects built from the engine's results and per-token reports.

Extensions are named `x_...`: `x_tokens` (our per-token reports, when the request asks with
`"x_report": true`) and, in `usage`, the prompt tokens processed and reused and the guesses
drafted and kept. `prompt_tokens_details.cached_tokens` is OpenAI's own name for the reused ones.
"""

import json
import math
import time
import uuid
from typing import Any, Dict, List, Optional

from ..models.protocol import ANSWER, THOUGHT
from .generation import Done, Token


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def logprob(p: Optional[float]) -> float:
    """log(p), with OpenAI's -9999.0 for an impossible token (JSON has no -inf)."""
    return math.log(p) if p and p > 0 else -9999.0


def usage(prompt_tokens: int, done: Done) -> Dict[str, Any]:
    s = done.result.stats
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.prompt_reused},
        "x_prompt_processed": s.prompt_tokens,
        "x_prompt_reused": s.prompt_reused,
        "x_media_tokens": s.media_tokens,
        "x_drafted": s.drafted,
        "x_kept": s.kept,
        "x_constrained_tokens": s.constrained_tokens,  # held to a schema, a grammar or a forced call
        "x_mask_ms": round(1000 * s.mask_seconds, 2),  # the host's time building their masks
        "x_prompt_tps": round(s.prompt_tps, 2),
        "x_generation_tps": round(s.generation_tps, 2),
    }


def tool_calls(calls: List[Dict[str, Any]], stream: bool = False) -> List[Dict[str, Any]]:
    """Parsed calls as OpenAI's `tool_calls` (arguments as a JSON string); `index` when streamed."""
    out = []
    for i, call in enumerate(calls):
        entry = {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
        out.append({"index": i, **entry} if stream else entry)
    return out


def x_token(token: Token) -> Dict[str, Any]:
    out = token.report.to_dict()
    out.update(piece=token.token_text, stop=token.is_stop)
    return out


def in_content(token: Token) -> bool:
    """A token of the answer's text (what `logprobs.content` lists): no stop token, no marker."""
    return token.report.channel == ANSWER and not token.is_stop


def chat_logprobs(tokens: List[Token], top: int) -> Optional[Dict[str, Any]]:
    content = []
    for token in tokens:
        if not in_content(token):
            continue
        r = token.report
        # A byte token's text alone is a replacement character; its bytes rebuild the character.
        content.append({
            "token": token.token_text, "logprob": logprob(r.prob), "bytes": list(_bytes(token, r.token, token.token_text)),
            "top_logprobs": [{"token": t or "", "logprob": logprob(p), "bytes": list(_bytes(token, i, t))}
                             for i, p, t in r.top[:top]],
        })
    return {"content": content}


def _bytes(token: Token, token_id: int, text: Optional[str]) -> bytes:
    return token.bytes_of(token_id) if token.bytes_of is not None else (text or "").encode()


class OpenAIForm:
    """What OpenAI's chat and text completions share as forms (streaming.py): unnamed events
    ended by `data: [DONE]`, and OpenAI's error object."""

    named_events = False
    done_marker = "[DONE]"
    ping_after = None

    @staticmethod
    def error_event(error) -> Dict[str, Any]:
        return error.body()

    def token_chunks(self, token: Token) -> List[Dict[str, Any]]:
        chunk = self.token_chunk(token)
        return [] if chunk is None else [chunk]


class ChatFormat(OpenAIForm):
    """The chat completion, or its stream of chunks, for one request."""

    def __init__(self, model: str, logprobs: bool, top_logprobs: int, report: bool):
        self.id, self.created, self.model = new_id("chatcmpl"), int(time.time()), model
        self.logprobs, self.top, self.report = logprobs, top_logprobs, report

    def completion(self, prompt_tokens: int, tokens: List[Token], done: Done) -> Dict[str, Any]:
        result = done.result
        message: Dict[str, Any] = {"role": "assistant", "content": done.text}
        if result.thinking:
            message["reasoning_content"] = result.thinking
        if result.tool_calls:
            message["tool_calls"] = tool_calls(result.tool_calls)
            message["content"] = done.text or None
        choice: Dict[str, Any] = {
            "index": 0, "message": message, "finish_reason": done.finish_reason,
            "logprobs": chat_logprobs(tokens, self.top) if self.logprobs else None,
        }
        if self.report:
            choice["x_tokens"] = [x_token(t) for t in tokens]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage(prompt_tokens, done)}

    def chunk(self, delta: Dict[str, Any], finish_reason: Optional[str] = None, **extra) -> Dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [choice]}

    def first_chunks(self, started=None) -> List[Dict[str, Any]]:
        """What a stream opens with, before any token: the assistant's role."""
        return [self.chunk({"role": "assistant", "content": ""})]

    def token_chunk(self, token: Token) -> Optional[Dict[str, Any]]:
        """The chunk for one token, or None when it shows nothing and no report was asked."""
        r = token.report
        delta: Dict[str, Any] = {}
        if r.text and r.channel == ANSWER:
            delta["content"] = r.text
        elif r.text and r.channel == THOUGHT:
            delta["reasoning_content"] = r.text
        extra: Dict[str, Any] = {}
        if self.report:
            extra["x_tokens"] = [x_token(token)]
        logprobs = self.logprobs and in_content(token)
        if not delta and not extra and not logprobs:
            return None
        chunk = self.chunk(delta, **extra)
        if logprobs:
            chunk["choices"][0]["logprobs"] = chat_logprobs([token], self.top)
        return chunk

    def last_chunks(self, prompt_tokens: int, done: Done, include_usage: bool) -> List[Dict[str, Any]]:
        chunks = []
        if done.result.tool_calls:
            chunks.append(self.chunk({"tool_calls": tool_calls(done.result.tool_calls, stream=True)}))
        chunks.append(self.chunk({}, done.finish_reason))
        if include_usage:
            chunks.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "choices": [], "usage": usage(prompt_tokens, done)})
        return chunks


class CompletionFormat(OpenAIForm):
    """The text completion (`/v1/completions`), or its chunks, with the legacy logprobs shape."""

    def __init__(self, model: str, logprobs: Optional[int], report: bool):
        self.id, self.created, self.model = new_id("cmpl"), int(time.time()), model
        self.logprobs, self.report = logprobs, report
        self.offset = 0

    def first_chunks(self, started=None) -> List[Dict[str, Any]]:
        return []  # a completion's stream opens with its first text

    def _choice(self, text: str, tokens: List[Token], finish_reason: Optional[str]) -> Dict[str, Any]:
        choice: Dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if self.logprobs is not None:
            shown = [t for t in tokens if not t.is_stop]
            offsets = []
            for t in shown:
                offsets.append(self.offset)
                self.offset += len(t.report.text or "")
            choice["logprobs"] = {
                "tokens": [t.token_text for t in shown],
                "token_logprobs": [logprob(t.report.prob) for t in shown],
                "top_logprobs": [{(s or ""): logprob(p) for _, p, s in t.report.top[: self.logprobs]} for t in shown],
                "text_offset": offsets,
            }
        if self.report:
            choice["x_tokens"] = [x_token(t) for t in tokens]
        return choice

    def _object(self, choices: List[Dict[str, Any]], usage_: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def completion(self, prompt_tokens: int, tokens: List[Token], done: Done) -> Dict[str, Any]:
        return self._object([self._choice(done.text, tokens, done.finish_reason)], usage(prompt_tokens, done))

    def token_chunk(self, token: Token) -> Optional[Dict[str, Any]]:
        if not token.report.text and not self.report and (self.logprobs is None or token.is_stop):
            return None
        return self._object([self._choice(token.report.text or "", [token], None)])

    def last_chunks(self, prompt_tokens: int, done: Done, include_usage: bool) -> List[Dict[str, Any]]:
        chunks = [self._object([{"index": 0, "text": "", "logprobs": None, "finish_reason": done.finish_reason}])]
        if include_usage:
            chunks.append(self._object([], usage(prompt_tokens, done)))
        return chunks
