"""The Responses API's answer: the `response` object, or its stream of events in the order
OpenAI's clients parse them (`response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its content's `.added` / deltas / `.done`, and
`response.output_item.done`, then `response.completed` or `response.incomplete`).

A thought streams as a `reasoning` item (`response.reasoning_text.delta`), the answer as a
`message` item. Tool calls are written in Gemma's own syntax and read once the call has closed,
so each comes as a `function_call` item after the text, its arguments in one delta. The items
streamed are the very items of the final response (ids included), which OpenAI's streaming
helper checks.
"""

import json
import time
import uuid
from typing import Any, Dict, List, Optional

from ..models.protocol import ANSWER, THOUGHT
from .generation import Done, Token
from .chat_objects import x_token
from .chat_objects import usage as chat_usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(item_id: str, text: str, status: str = "completed") -> Dict[str, Any]:
    """`status`: "incomplete" for an answer cut off by max_output_tokens, as OpenAI marks it."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def reasoning_item(item_id: str, text: str) -> Dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False), "status": "completed"}


class ResponsesFormat:
    """One request's `response`, whole or as events. `echo`: the request's settings, which the
    response object repeats."""

    named_events = True  # each event also on an `event:` line, as OpenAI sends them
    done_marker = None  # no `data: [DONE]`: `response.completed` ends the stream
    ping_after = None

    def __init__(self, model: str, echo: Dict[str, Any], report: bool):
        self.id, self.created, self.model, self.echo, self.report = new_id("resp"), int(time.time()), model, echo, report
        self.sequence = 0
        self.items: List[Dict[str, Any]] = []  # the output items, in order, as they close
        self.open: Optional[Dict[str, Any]] = None  # the item being streamed: its kind, id and text
        self.seen: List[Token] = []  # every token streamed (for the usage and the reports at the end)

    def response(self, status: str, prompt_tokens: Optional[int] = None, done: Optional[Done] = None,
                 tokens: Optional[List[Token]] = None) -> Dict[str, Any]:
        text = "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
               "output": list(self.items), "output_text": text, "error": None, "incomplete_details": None,
               "previous_response_id": None, "store": False, "parallel_tool_calls": False,
               "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {}, "usage": None,
               **self.echo}
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if done is not None:
            out["usage"] = usage(prompt_tokens, done, tokens or [])
            if self.report:
                out["x_tokens"] = [x_token(t) for t in tokens or []]
        return out

    def completion(self, prompt_tokens: int, tokens: List[Token], done: Done) -> Dict[str, Any]:
        result = done.result
        if result.thinking:
            self.items.append(reasoning_item(new_id("rs"), result.thinking))
        if done.text or not result.tool_calls:
            self.items.append(message_item(new_id("msg"), done.text, status_of(done)))
        self.items.extend(call_item(c) for c in result.tool_calls)
        return self.response(status_of(done), prompt_tokens, done, tokens)

    def event(self, kind: str, **fields) -> Dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def error_event(self, error) -> Dict[str, Any]:
        """An error after the stream opened: `response.failed`, with the error in the response."""
        failed = self.response("failed")
        failed["error"] = {"code": error.code or error.type, "message": error.message}
        return self.event("response.failed", response=failed)

    def first_chunks(self, started=None) -> List[Dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self.event("response.created", response=snapshot), self.event("response.in_progress", response=snapshot)]

    def token_chunks(self, token: Token) -> List[Dict[str, Any]]:
        self.seen.append(token)
        r = token.report
        if token.is_stop or not r.text or r.channel not in (ANSWER, THOUGHT):
            return []
        kind = "message" if r.channel == ANSWER else "reasoning"
        events = [] if self.open and self.open["kind"] == kind else [*self._close(), *self._open(kind)]
        self.open["text"] += r.text
        where = {"item_id": self.open["id"], "output_index": len(self.items), "content_index": 0}
        extra = {"x_tokens": [x_token(token)]} if self.report else {}
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        return [*events, self.event(name, **where, delta=r.text, **({"logprobs": []} if kind == "message" else {}),
                                    **extra)]

    def _open(self, kind: str) -> List[Dict[str, Any]]:
        self.open = {"kind": kind, "id": new_id("msg" if kind == "message" else "rs"), "text": ""}
        empty = message_item(self.open["id"], "") if kind == "message" else reasoning_item(self.open["id"], "")
        empty = {**empty, "status": "in_progress", "content": []} if kind == "message" else {**empty, "content": []}
        index = len(self.items)
        events = [self.event("response.output_item.added", output_index=index, item=empty)]
        part = {"type": "output_text", "text": "", "annotations": []} if kind == "message" else {"type": "reasoning_text", "text": ""}
        events.append(self.event("response.content_part.added", item_id=self.open["id"], output_index=index,
                                 content_index=0, part=part))
        return events

    def _close(self, status: str = "completed") -> List[Dict[str, Any]]:
        if self.open is None:
            return []
        open_, index = self.open, len(self.items)
        if open_["kind"] == "message":
            item = message_item(open_["id"], open_["text"], status)
        else:
            item = reasoning_item(open_["id"], open_["text"])
        where = {"item_id": open_["id"], "output_index": index, "content_index": 0}
        done = "response.output_text.done" if open_["kind"] == "message" else "response.reasoning_text.done"
        events = [self.event(done, **where, text=open_["text"], **({"logprobs": []} if open_["kind"] == "message" else {})),
                  self.event("response.content_part.done", **where, part=item["content"][0]),
                  self.event("response.output_item.done", output_index=index, item=item)]
        self.items.append(item)
        self.open = None
        return events

    def last_chunks(self, prompt_tokens: int, done: Done, include_usage: bool = False) -> List[Dict[str, Any]]:
        events = self._close(status_of(done))  # (an answer cut off ends its message incomplete)
        if not any(i["type"] == "message" for i in self.items) and not done.result.tool_calls:
            events += [*self._open("message"), *self._close(status_of(done))]  # the plain answer's empty message
        for call in done.result.tool_calls:
            item, index = call_item(call), len(self.items)
            events.append(self.event("response.output_item.added", output_index=index,
                                     item={**item, "arguments": "", "status": "in_progress"}))
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                     delta=item["arguments"]))
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     arguments=item["arguments"]))
            events.append(self.event("response.output_item.done", output_index=index, item=item))
            self.items.append(item)
        status = status_of(done)
        final = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self.event(final, response=self.response(status, prompt_tokens, done, self.seen)))
        return events


def status_of(done: Done) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def usage(prompt_tokens: int, done: Done, tokens: List[Token]) -> Dict[str, Any]:
    """Responses' usage, with the chat route's `x_` extensions beside it."""
    chat = chat_usage(prompt_tokens, done)
    reasoning = sum(1 for t in tokens if t.report.channel == THOUGHT)
    extensions = {k: v for k, v in chat.items() if k.startswith("x_")}
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": chat["total_tokens"], **extensions}
