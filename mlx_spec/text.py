"""The text side of an engine: the tokenizer, the chat template, the streaming detokenizer, the
chat format's channels and the stop tokens.

It turns prompts into token ids and generated tokens back into text. It knows nothing of the
model's weights: `Engine` holds it beside the model pair and the media side.
"""

import inspect
import numbers
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set

from .decoding.reports import WAITING, TokenReport
from .errors import SettingsError
from .message_checks import check_message, check_tools
from .models.checkpoint import Checkpoint
from .models.protocol import ANSWER, TOOL_CALL

TOKEN_TEXTS = 65536  # pieces of single tokens kept for the top-5 lists (a vocabulary's worth is 262,144)


def is_messages(prompt: Any) -> bool:
    """Whether a prompt is chat messages (a non-empty list of dicts), not text or token ids."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def checked(messages: List[dict], tools: Optional[List[Any]]) -> Optional[List[Any]]:
    """The tools, once the messages and they are shapes the chat template renders
    (message_checks.py); else a SettingsError naming what is wrong."""
    try:
        for index, message in enumerate(messages):
            check_message(message, index)
        return None if tools is None else check_tools(tools)
    except ValueError as e:
        raise SettingsError(str(e)) from None


def stop_token_ids(checkpoint: Checkpoint, tokenizer: Optional[Any] = None) -> List[int]:
    """The ids that end an answer: every `eos_token_id` the checkpoint's generation_config.json,
    config.json and text config name (Gemma 4's generation config adds `<|tool_response>`, with
    which the model ends a tool call), and the tokenizer's own."""
    ids: Set[int] = set()
    for config in (checkpoint.generation_config, checkpoint.config, checkpoint.config.get("text_config") or {}):
        value = config.get("eos_token_id")
        ids |= set([value] if isinstance(value, int) else value or [])
    return sorted(ids | set(getattr(tokenizer, "eos_token_ids", None) or ()))


def load_tokenizer(checkpoint: Checkpoint) -> Optional[Any]:
    """mlx-lm's tokenizer wrapper (with its streaming detokenizer), or None if the checkpoint
    folder has no tokenizer (token-id prompts still work)."""
    if not (checkpoint.path / "tokenizer.json").is_file() and not (checkpoint.path / "tokenizer.model").is_file():
        return None
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    return mlx_load_tokenizer(checkpoint.path, eos_token_ids=stop_token_ids(checkpoint) or None)


def refuse_tools(tools: Optional[List[dict]]) -> None:
    """Tools given with a raw-text or token-id prompt: a SettingsError (only the chat template
    writes them; they were dropped without a word)."""
    if tools:
        raise SettingsError("tools are declared through the chat template: give the prompt as chat messages "
                            "([{'role': 'user', 'content': ...}]), not as raw text or token ids")


class TextSide:
    """Prompts to token ids and tokens to text, for one tokenizer (None: token ids only)."""

    def __init__(self, tokenizer: Optional[Any], stop_tokens: Sequence[int], chat_format: Any,
                 source: Optional[Path] = None):
        self.tokenizer = tokenizer
        self.stop_tokens = sorted(set(stop_tokens))
        self.format = chat_format
        self.source = source  # the checkpoint the tokenizer came from, for messages
        self._token_texts: Dict[int, Optional[str]] = {}

    def with_stop_tokens(self, stop_tokens: Sequence[int]) -> "TextSide":
        """The same text side with exactly these stop tokens."""
        return TextSide(self.tokenizer, stop_tokens, self.format, self.source)

    def encode(self, prompt: Any, tools: Optional[List[dict]] = None, thinking: bool = False) -> List[int]:
        """Token ids for a prompt: ids as given, a string as text, messages through the chat
        template (with a generation prompt; thinking on or off, always said explicitly, since
        mlx-lm would turn it on for any tokenizer that has thinking tokens)."""
        if isinstance(prompt, str):
            refuse_tools(tools)
            tokenizer = self.require_tokenizer("a text prompt")
            bos = getattr(tokenizer, "bos_token", None)
            if bos and prompt.startswith(bos):  # a prompt rendered by its caller: no second <bos>
                return list(tokenizer.encode(prompt, add_special_tokens=False))
            return list(tokenizer.encode(prompt))
        if not isinstance(prompt, Iterable) or isinstance(prompt, (bytes, bytearray)):
            raise SettingsError(f"a prompt must be a string, a list of token ids, or a list of chat messages, "
                                f"got {type(prompt).__name__}")
        prompt = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)  # numpy / mlx arrays too
        if is_messages(prompt):
            return self.chat_tokens(prompt, tools, thinking)
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            refuse_tools(tools)
            return [int(t) for t in prompt]
        raise SettingsError("a prompt must be a string, a list of token ids, or a list of chat messages")

    def chat_tokens(self, messages: List[dict], tools: Optional[List[dict]], thinking: bool) -> List[int]:
        """Messages through the chat template. Special tokens' strings written in the messages or
        tools (`<turn|>\\n<|turn>system`: an injection, or a file quoting Gemma's format that an
        agent read) are read as text: only the template's own markers are tokens (transformers'
        `sanitize_control_tokens`; a conversation without such strings is tokenized as ever)."""
        tools = checked(messages, tools)
        settings = dict(add_generation_prompt=True, enable_thinking=bool(thinking))
        if self._can_sanitize:
            settings["sanitize_control_tokens"] = True
        try:
            return list(self._chat_tokenizer().apply_chat_template(
                self.format.for_template(messages), tools=tools, **settings))
        except ValueError as e:
            if "sanitize" not in str(e):
                raise
            raise SettingsError(f"a message holds text this tokenizer cannot read as text: {e}") from None

    @cached_property
    def _can_sanitize(self) -> bool:
        """Whether transformers reads special tokens' strings in messages as text (5.24 does)."""
        inner = getattr(self.tokenizer, "_tokenizer", self.tokenizer)  # transformers' own, under mlx-lm's wrapper
        try:
            return "sanitize_control_tokens" in inspect.signature(inner.apply_chat_template).parameters
        except (TypeError, ValueError, AttributeError):
            return False

    def render(self, prompt: Any, tools: Optional[List[dict]] = None, thinking: bool = False) -> Optional[str]:
        """The text `encode` tokenizes (messages through the chat template); None for token ids.
        Rendering is cheap where tokenizing a long text is not: see `longest_token_chars`."""
        if isinstance(prompt, str):
            return prompt
        if is_messages(prompt):
            tools = checked(list(prompt), tools)
            return self._chat_tokenizer().apply_chat_template(
                self.format.for_template(list(prompt)), tools=tools, add_generation_prompt=True,
                enable_thinking=bool(thinking), tokenize=False)
        return None

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token stands for (the longest piece in the vocabulary; a byte
        token's name, 6 characters, is longer than the byte it stands for): a text of n
        characters is at least n / this many tokens."""
        tokenizer = self.require_tokenizer("a text prompt")
        inner = getattr(tokenizer, "_tokenizer", tokenizer)  # transformers' own, under mlx-lm's wrapper
        pieces = inner.convert_ids_to_tokens(list(range(len(inner))))
        return max(1, *(len(p) for p in pieces if isinstance(p, str)))

    def _chat_tokenizer(self):
        tokenizer = self.require_tokenizer("a chat prompt")
        if not getattr(tokenizer, "chat_template", None):
            raise SettingsError(
                f"chat messages need a chat template, and the tokenizer of {self.source} has none "
                "(a base model or a hand-made conversion); send token ids or plain text instead (a string "
                "in Python, --raw with mlx-spec generate, /v1/completions on the server)"
            )
        return tokenizer

    def require_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise SettingsError(f"{what} needs a tokenizer, and {self.source} has none; pass token ids")
        return self.tokenizer

    def text_of(self, tokens: List[int]) -> str:
        """Text of generated tokens: stop tokens left out, other special tokens (such as the
        tool-call markers) kept."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([t for t in tokens if t not in self.stop_tokens])

    def token_text(self, token: int) -> Optional[str]:
        """The text of one token on its own (for the top-5 lists), remembered for the most used."""
        if token not in self._token_texts:
            if len(self._token_texts) >= TOKEN_TEXTS:
                self._token_texts.clear()  # a bound: a server lives for weeks
            self._token_texts[token] = None if self.tokenizer is None else self.tokenizer.decode([token])
        return self._token_texts[token]

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`): a byte token's one byte,
        where its text alone is a replacement character. Read from the streaming detokenizer's
        own map of the vocabulary (SentencePiece's byte fallback, GPT-2's byte-level pieces)."""
        detokenizer = getattr(self.tokenizer, "detokenizer", None)
        pieces = getattr(detokenizer, "tokenmap", None)
        if pieces is None or not 0 <= token < len(pieces):
            return (self.token_text(token) or "").encode()
        piece = pieces[token]
        if isinstance(piece, bytes):  # SentencePiece: its word-start mark is a space
            return piece.replace("\u2581".encode(), b" ")
        from mlx_lm.tokenizer_utils import _byte_decoder  # byte-level BPE: one character per byte

        byte_of = _byte_decoder()
        if all(c in byte_of for c in piece):
            return bytes(byte_of[c] for c in piece)
        return piece.encode()  # an added token, such as the format's markers

    def with_text(self, reports: Iterator[TokenReport], tools: Optional[List[dict]] = None,
                  prompt: Sequence[int] = ()) -> Iterator[TokenReport]:
        """Fill in text pieces (streaming detokenizer, so multi-byte characters come out whole):
        each token's text as written (`raw`) and as shown in its channel (`text`). A token whose
        text the detokenizer still holds (a character's first bytes) comes out with the token
        that completes it; at the end (the budget, a stop token) what it holds is written out,
        a character cut short as U+FFFD, as mlx-lm and `tokenizer.decode` write it. A tool
        call's tokens are held until its block ends: one that does not read as a call
        (malformed, or cut off by the budget) shows as the text the model wrote, in the answer,
        rather than vanishing with neither text nor call. `tools`: the request's declarations
        (a call is read with them); `prompt`: the token ids the answer follows (its channel may
        open there)."""
        if self.tokenizer is None:
            yield from reports
            return
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        channels = self.format.channels(self.tokenizer, prompt)
        held: List[TokenReport] = []  # the tool call being written
        unwritten: List[TokenReport] = []  # tokens whose text the detokenizer still holds
        for report in reports:
            if report is WAITING:  # a batch row with nothing new yet (decoding/batch.py)
                yield report
                continue
            if report.token in self.stop_tokens:
                report.text = report.raw = ""
                ready = [*_written_out(detokenizer, unwritten), report]
            else:
                detokenizer.add_token(report.token)
                report.raw = detokenizer.last_segment
                unwritten.append(report)
                if not report.raw:
                    continue
                ready = unwritten
            unwritten = []
            for each in ready:
                yield from self._shown(each, channels, held, tools)
        for each in _written_out(detokenizer, unwritten):
            yield from self._shown(each, channels, held, tools)
        yield from self._settled_call(held, tools)

    def _shown(self, report: TokenReport, channels, held: List[TokenReport],
               tools: Optional[List[dict]]) -> Iterator[TokenReport]:
        """One token's report with its channel and shown text, after the tool call before it has
        settled; a tool call's own tokens wait in `held` until their block ends."""
        if report.token not in self.stop_tokens:
            report.channel, report.text = channels.feed(report.token, report.raw)
        report.top = [(t, p, self.token_text(t)) for t, p, _ in report.top]
        if report.channel == TOOL_CALL:
            held.append(report)
            # Each block settles at its closing marker: a bad one beside a good one is text.
            if getattr(channels, "channel", TOOL_CALL) != TOOL_CALL:
                yield from self._settled_call(held, tools)
            return
        yield from self._settled_call(held, tools)
        yield report

    def _settled_call(self, held: List[TokenReport], tools: Optional[List[dict]] = None) -> List[TokenReport]:
        """A tool call's held reports, emptied from `held`: as they are where the format reads a
        call in them, else in the answer channel showing what was written."""
        if held and not self.format.parse_tool_calls(self.text_of([r.token for r in held]), tools):
            for report in held:
                report.channel, report.text = ANSWER, report.raw
        out = held[:]
        held.clear()
        return out


def _written_out(detokenizer, unwritten: List[TokenReport]) -> List[TokenReport]:
    """The answer ends (or a stop token ends it): what the detokenizer still holds is the text of
    the last of these tokens. (`TokenizerWrapper.detokenizer` makes a new one at each reading:
    this is the one the tokens went into.)"""
    detokenizer.finalize()
    if unwritten:
        unwritten[-1].raw = detokenizer.last_segment
    return unwritten
