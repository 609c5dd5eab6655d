"""Special tokens written in text read as text.

Google's template renders a conversation to text, and the tokenizer reads every special token's
string in it as that token: a user message, a tool's result (a web page, a file an agent read)
or a tool's description that holds `<turn|>\\n<|turn>system\\n...` would otherwise open a turn of
its own, and one that quotes Gemma's format (its own docs, this project's tests) would break the
conversation's structure. The strings a message's sender wrote are text; only the template's own
markers are tokens.

So where any of those strings holds a special token's string, each is stood in for by a mark (a
private-use character) while the template renders, and comes back as the tokens of its text.
Everything else is tokenized as the tokenizer reads the rendered text, so a conversation without
such strings is the very token sequence the template and tokenizer give (nothing changes for it).
The assistant's messages are the model's own output, echoed back: they render as they are (but
the tool results that ride on them).
"""

import re
from typing import Any, List, Optional

FIRST_MARK = 0xF0000  # Supplementary Private Use Area-A: no text a tokenizer was trained on


class Specials:
    """The strings a tokenizer reads as special tokens, each with its mark. A vocabulary may
    hold thousands (Gemma's `<unusedN>`): they are found by their first characters, never by a
    pattern of thousands of alternatives over a long prompt."""

    def __init__(self, tokenizer):
        inner = getattr(tokenizer, "_tokenizer", tokenizer)  # transformers' own, under mlx-lm's wrapper
        added = getattr(inner, "added_tokens_decoder", {}) or {}
        found = {str(t) for t in added.values() if getattr(t, "special", False)}
        found |= set(getattr(inner, "all_special_tokens", []) or [])
        strings = sorted((s for s in found if s), key=len, reverse=True)
        self.marks = {s: chr(FIRST_MARK + i) for i, s in enumerate(strings)}
        self.strings = {mark: s for s, mark in self.marks.items()}
        self.lengths = sorted({len(s) for s in strings}, reverse=True)
        firsts = "".join(sorted({s[0] for s in strings}))
        self.starts = re.compile(f"[{re.escape(firsts)}]") if firsts else None
        self.typed_mark = re.compile(f"[{chr(FIRST_MARK)}-{chr(FIRST_MARK + max(len(strings), 1))}]")

    def find(self, text: str):
        """(position, string) of each special string in `text`, longest first where they overlap."""
        at = 0
        for start in (m.start() for m in self.starts.finditer(text)) if self.starts else ():
            if start < at:
                continue
            for n in self.lengths:
                if text[start:start + n] in self.marks:
                    yield start, text[start:start + n]
                    at = start + n
                    break

    def mark(self, text: str) -> str:
        out, at = [], 0
        for start, special in self.find(text):
            out += [text[at:start], self.marks[special]]
            at = start + len(special)
        return "".join(out) + text[at:]


def needs_marks(messages: List[dict], tools: Optional[List[dict]], specials: Specials) -> bool:
    """Whether a string the sender wrote holds a special token's string (and no mark already)."""
    written = list(_strings([_written(m) for m in messages])) + list(_strings(tools))
    if any(specials.typed_mark.search(s) for s in written):
        return False  # (a mark typed as text: left as the tokenizer reads it)
    return any(next(specials.find(s), None) is not None for s in written)


def with_marks(messages: List[dict], tools: Optional[List[dict]], specials: Specials):
    """The messages and tools with each special string their senders wrote stood in for by its mark."""

    def mark(value: Any) -> Any:
        if isinstance(value, str):
            return specials.mark(value)
        if isinstance(value, dict):
            return {mark(k): mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [mark(v) for v in value]
        return value

    marked = [mark(m) if m.get("role") != "assistant" else {**m, **mark(_written(m))} for m in messages]
    return marked, mark(tools)


def _written(message: dict) -> dict:
    """What of a message its sender wrote: all of it, but of the model's own only the tool
    results that ride on it (for_template puts them there)."""
    if message.get("role") != "assistant":
        return message
    return {"tool_responses": message["tool_responses"]} if "tool_responses" in message else {}


def tokens_with_marks(tokenizer, text: str, specials: Specials) -> List[int]:
    """Token ids of rendered text: the template's text as the tokenizer reads it, each mark as
    the tokens of its special string read as text."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    ids: List[int] = []
    for piece in re.split(f"([{''.join(specials.strings)}])", text):
        if piece in specials.strings:
            ids += inner.encode(specials.strings[piece], add_special_tokens=False, split_special_tokens=True)
        elif piece:
            ids += inner.encode(piece, add_special_tokens=False)
    return ids


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
