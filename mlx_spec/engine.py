"""The engine: a loaded target, its drafter and tokenizer; `generate` and `stream`.

Data flows one way: Engine -> Decoder -> (drafter, target, caches, sampling).
"""

import numbers
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from .assistant import Assistant
from .chat import ChatSession
from .chat_format import ANSWER, THOUGHT, Channels, for_template, parse_tool_calls
from .decoder import Decoder, SequenceState, Stats
from .drafters import Drafter, LookupThenMTP, MTPDrafter, PromptLookup
from .prompt_cache import PromptCache
from .loading import (
    AUTO,
    DEFAULT_TARGET,
    check_pair,
    drafter_for,
    resolve_names,
    load_drafter,
    load_target,
    load_tokenizer,
)
from .memory import DEFAULT_CONTEXT
from .memory import check as check_memory
from .reports import TokenReport
from .sampling import SamplingSettings, SettingsError
from .target import Target

Prompt = Union[str, Sequence[int], Sequence[Dict[str, Any]]]


@dataclass
class GenerationResult:
    tokens: List[int]  # generated ids, a stop token included when one ended the answer
    text: str  # the answer: no thought, no tool-call markup, no stop token ("" without a tokenizer)
    steps: List[TokenReport]
    stats: Stats
    finish_reason: str  # "tool_calls", "stop" (a stop token) or "length" (max_tokens)
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)  # [{"id", "name", "arguments"}]
    thinking: str = ""  # the thought, when thinking was on and the model thought


class Engine:
    """Gemma 4 target + MTP drafter + tokenizer. Create it with `mlx_spec.load`."""

    def __init__(
        self,
        target: Target,
        assistant: Optional[Assistant],
        tokenizer: Optional[Any],
        stop_tokens: Sequence[int],
        target_path: Optional[Path] = None,
        drafter_path: Optional[Path] = None,
    ):
        self.target = target
        self.assistant = assistant
        self.tokenizer = tokenizer
        self.stop_tokens = sorted(set(stop_tokens))
        self.target_path = target_path
        self.drafter_path = drafter_path
        self.mtp_drafter = MTPDrafter(assistant, target) if assistant is not None else None
        self.lookup = PromptLookup()

    # -- prompts and text ------------------------------------------------------------------

    def encode(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False) -> List[int]:
        """Token ids for a prompt: ids as given, a string as text, messages through the chat
        template (with a generation prompt; thinking on or off, always said explicitly, since
        mlx-lm would turn it on for any tokenizer that has thinking tokens)."""
        if isinstance(prompt, str):
            return list(self._require_tokenizer("a text prompt").encode(prompt))
        prompt = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)  # numpy / mlx arrays too
        if prompt and all(isinstance(m, dict) for m in prompt):
            tokenizer = self._require_tokenizer("chat messages")
            if not getattr(tokenizer, "chat_template", None):
                raise SettingsError(
                    f"chat messages need a chat template, and the tokenizer of {self.target_path} has none "
                    "(a base model or a hand-made conversion); send token ids or plain text instead (a string "
                    "in Python, --raw with mlx-spec generate, /v1/completions on the server)"
                )
            return list(tokenizer.apply_chat_template(
                for_template(prompt), tools=tools, add_generation_prompt=True, enable_thinking=bool(thinking)
            ))
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
        raise SettingsError("a prompt must be a string, a list of token ids, or a list of chat messages")

    def _require_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise SettingsError(f"{what} needs a tokenizer, and {self.target_path} has none; pass token ids")
        return self.tokenizer

    def decode(self, tokens: List[int]) -> str:
        """Text of generated tokens: stop tokens left out, other special tokens (such as the
        tool-call markers) kept."""
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode([t for t in tokens if t not in self.stop_tokens])

    @lru_cache(maxsize=65536)
    def piece(self, token: int) -> Optional[str]:
        """The text of one token on its own (for the top-5 lists)."""
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    # -- decoding --------------------------------------------------------------------------

    def decoder(
        self,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        mtp: Optional[bool] = None,
        draft_tokens: Optional[int] = None,
        drafter: Optional[Drafter] = None,
        lookup: bool = True,
        report: bool = True,
    ) -> Decoder:
        """A decoder with these settings (see `generate`)."""
        settings = SamplingSettings(temperature, top_k, top_p, seed)
        if mtp is False:
            drafter = None
        elif drafter is None:
            if mtp and self.mtp_drafter is None:
                raise SettingsError("MTP needs a drafter, and none was loaded; pass mtp=False")
            drafter = self._default_drafter(lookup)
        return Decoder(self.target, settings, drafter, draft_tokens, report, self.stop_tokens)

    def _default_drafter(self, lookup: bool) -> Optional[Drafter]:
        """Prompt lookup where the text has a match, the MTP assistant where not; either alone
        when the other is off or missing."""
        if not lookup:
            return self.mtp_drafter
        if self.mtp_drafter is None:
            return self.lookup
        return LookupThenMTP(self.lookup, self.mtp_drafter)

    def stream(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        tools: Optional[List[dict]] = None,
        thinking: bool = False,
        decoder: Optional[Decoder] = None,
        cache: Optional[PromptCache] = None,
        **settings,
    ) -> Iterator[TokenReport]:
        """Yield a report for every generated token as it settles (see `generate`). With a
        `PromptCache`, a prompt that starts like an earlier one resumes its sequence."""
        decoder = decoder or self.decoder(**settings)
        tokens = self.encode(prompt, tools, thinking)
        state = cache.take(tokens)[0] if cache is not None else SequenceState(self.target)
        decoder.start(state, tokens, max_tokens)  # on an error the state, maybe half written, is dropped
        try:
            yield from self.with_text(decoder.generate(state, max_tokens))
        finally:
            if cache is not None:
                cache.give_back(state)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        mtp: Optional[bool] = None,
        draft_tokens: Optional[int] = None,
        drafter: Optional[Drafter] = None,
        lookup: bool = True,
        report: bool = True,
        tools: Optional[List[dict]] = None,
        thinking: bool = False,
        cache: Optional[PromptCache] = None,
    ) -> GenerationResult:
        """Generate up to `max_tokens` tokens; the output is exactly the target's alone.

        temperature 0 is greedy; otherwise temperature, then top_k (0: off), then top_p (1: off).
        Drafting (the default): prompt-lookup guesses where the text repeats itself, the MTP
        assistant's elsewhere (lookup=False: the assistant's only), with the number of guesses
        chosen each cycle from the measured acceptance and costs; `draft_tokens` fixes it.
        mtp=False decodes with the target alone (True insists on a loaded assistant); `drafter`
        replaces both with any object following the drafter protocol. report=False skips the
        per-token distribution figures. thinking=True lets the model think first (its thought
        comes back apart, in `result.thinking`). `tools`: OpenAI-style function declarations.
        """
        decoder = self.decoder(
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, mtp=mtp,
            draft_tokens=draft_tokens, drafter=drafter, lookup=lookup, report=report,
        )
        steps = list(self.stream(prompt, max_tokens=max_tokens, tools=tools, thinking=thinking, decoder=decoder, cache=cache))
        return self.result(steps, decoder.stats)

    def result(self, steps: List[TokenReport], stats: Stats) -> GenerationResult:
        """The result of a finished generation from its reports."""
        tokens = [s.token for s in steps]
        calls = parse_tool_calls(self.decode(tokens))
        finish = "tool_calls" if calls else "stop" if tokens and tokens[-1] in self.stop_tokens else "length"
        text = "".join(s.text or "" for s in steps if s.channel == ANSWER)
        thinking = "".join(s.text or "" for s in steps if s.channel == THOUGHT)
        return GenerationResult(tokens, text, steps, stats, finish, calls, thinking)

    def chat(
        self, system_prompt: Optional[str] = None, tools: Optional[List[dict]] = None, thinking: bool = False, **settings
    ) -> ChatSession:
        """A multi-turn session that keeps the caches between turns (settings as `generate`)."""
        return ChatSession(self, system_prompt=system_prompt, tools=tools, thinking=thinking, **settings)

    def with_text(self, reports: Iterator[TokenReport]) -> Iterator[TokenReport]:
        """Fill in text pieces (streaming detokenizer, so multi-byte characters come out whole):
        each token's text as written (`raw`) and as shown in its channel (`text`)."""
        if self.tokenizer is None:
            yield from reports
            return
        detok = self.tokenizer.detokenizer
        detok.reset()
        channels = Channels(self.tokenizer)
        for report in reports:
            if report.token in self.stop_tokens:
                report.text = report.raw = ""
            else:
                detok.add_token(report.token)
                report.raw = detok.last_segment
                report.channel, report.text = channels.feed(report.token, report.raw)
            report.top = [(t, p, self.piece(t)) for t, p, _ in report.top]
            yield report


def load(
    model: str = DEFAULT_TARGET,
    drafter: Optional[str] = AUTO,
    drafter_bits: Optional[int] = None,
    drafter_mode: Optional[str] = None,
    context: int = DEFAULT_CONTEXT,
    force: bool = False,
) -> Engine:
    """Load the Gemma 4 target and (unless `drafter` is None) its MTP assistant.

    `model`: a size by name (e2b, e4b, 26b-a4b, 31b: the 4-bit MLX conversion), a hub repo id or
    a local folder. `drafter`: "auto" (the assistant of the target's size), a size by name, a hub
    id or a folder. `drafter_bits` (4 or 8) and `drafter_mode` (affine, mxfp4, mxfp8, nvfp4)
    quantize the drafter after loading. Before anything is downloaded, the memory the pair needs
    with `context` tokens is compared with this machine's; `force=True` loads it anyway. Raises
    `LoadError` with a message naming the problem.
    """
    model, drafter = resolve_names(model, drafter)
    check_memory(model, None if drafter == AUTO else drafter, context, force)
    target, target_ckpt = load_target(model)
    if drafter == AUTO:
        drafter = drafter_for(target_ckpt)
    assistant, drafter_path = None, None
    if drafter is not None:
        assistant, drafter_ckpt = load_drafter(drafter, drafter_bits, drafter_mode)
        drafter_path = drafter_ckpt.path
        check_pair(target, assistant, drafter_path)
    tokenizer = load_tokenizer(target_ckpt)
    stop = set(_ids(target_ckpt.generation_config.get("eos_token_id")))
    stop |= set(_ids(target_ckpt.config.get("eos_token_id")))
    stop |= set(_ids((target_ckpt.config.get("text_config") or {}).get("eos_token_id")))
    if tokenizer is not None:
        stop |= set(tokenizer.eos_token_ids)
    return Engine(target, assistant, tokenizer, stop, target_ckpt.path, drafter_path)


def _ids(value) -> List[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
