"""The engine: a loaded target, its drafter and tokenizer; `generate` and `stream`.

Data flows one way: Engine -> Decoder -> (drafter, target, caches, sampling).
"""

import numbers
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from .assistant import Assistant
from .chat import ChatSession
from .chat_format import Channels, for_template
from .decoder import Decoder
from .generation import Generation, GenerationResult
from .drafting import Chain, Drafter, MTPDrafter, PromptLookup
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
from .media.audio import MediaError
from .media.items import IMAGE, Prepared
from .media.loading import check_kind, load_media
from .media.prompt import expand, has_media, split_media
from .memory import DEFAULT_CONTEXT
from .memory import check as check_memory
from .options import Options, make
from .reports import TokenReport
from .sampling import SettingsError
from .target import Target

Prompt = Union[str, Sequence[int], Sequence[Dict[str, Any]], Prepared]


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
        target_config: Optional[dict] = None,
    ):
        self.target = target
        self.assistant = assistant
        self.tokenizer = tokenizer
        self.stop_tokens = sorted(set(stop_tokens))
        self.target_path = target_path
        self.drafter_path = drafter_path
        self.target_config = target_config or {}
        self.media = None  # the media encoder, loaded with the first image or audio (media_encoder())
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
            if has_media(prompt):
                raise SettingsError("these messages have images or audio: use prepare() for their tokens and media")
            return self._chat_tokens(prompt, tools, thinking)
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
        raise SettingsError("a prompt must be a string, a list of token ids, or a list of chat messages")

    def prepare(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False,
                image_tokens: Optional[int] = None, allow_files: bool = True) -> Prepared:
        """Token ids for a prompt, as `encode`, and its media: each image or audio part of the
        messages becomes its begin marker, soft tokens and end marker, and a span that puts the
        media encoder's embeddings there at prefill. `image_tokens`: soft tokens per image (70,
        140, 280, 560 or 1120; the checkpoint's default when None). `allow_files`: whether a
        part may name a local file (the server allows it only when told to)."""
        if isinstance(prompt, Prepared):
            return prompt
        if not _is_messages(prompt) or not has_media(prompt):
            return Prepared(self.encode(prompt, tools, thinking), [])
        messages, sources = split_media(list(prompt), allow_files)
        encoder = self.media_encoder()
        items = []
        for source in sources:
            check_kind(encoder, source.kind, self.target_path)
            try:
                items.append(encoder.image(source.value, image_tokens) if source.kind == IMAGE
                             else encoder.audio(source.value))
            except MediaError as e:
                raise MediaError(f"{source.where}: {e}") from None
        return Prepared(*expand(self._chat_tokens(messages, tools, thinking), items, encoder.tokens, encoder.embed))

    def _chat_tokens(self, messages: List[dict], tools: Optional[List[dict]], thinking: bool) -> List[int]:
        return list(self._chat_tokenizer().apply_chat_template(
            for_template(messages), tools=tools, add_generation_prompt=True, enable_thinking=bool(thinking)))

    def media_encoder(self):
        """The checkpoint's media encoder, loaded the first time it is needed."""
        if self.media is None:
            self.media = load_media(self.target_path, self.target_config)
        return self.media

    def render(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False) -> Optional[str]:
        """The text `encode` tokenizes (messages through the chat template); None for token ids.
        Rendering is cheap where tokenizing a long text is not: see `longest_token_chars`."""
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return self._chat_tokenizer().apply_chat_template(
                for_template(list(prompt)), tools=tools, add_generation_prompt=True, enable_thinking=bool(thinking),
                tokenize=False)
        return None

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token stands for (the longest piece in the vocabulary; a byte
        token's name, 6 characters, is longer than the byte it stands for): a text of n
        characters is at least n / this many tokens."""
        tokenizer = self._require_tokenizer("a text prompt")
        inner = getattr(tokenizer, "_tokenizer", tokenizer)  # transformers' own, under mlx-lm's wrapper
        pieces = inner.convert_ids_to_tokens(list(range(len(inner))))
        return max(1, *(len(p) for p in pieces if isinstance(p, str)))

    def _chat_tokenizer(self):
        tokenizer = self._require_tokenizer("chat messages")
        if not getattr(tokenizer, "chat_template", None):
            raise SettingsError(
                f"chat messages need a chat template, and the tokenizer of {self.target_path} has none "
                "(a base model or a hand-made conversion); send token ids or plain text instead (a string "
                "in Python, --raw with mlx-spec generate, /v1/completions on the server)"
            )
        return tokenizer

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
    def token_text(self, token: int) -> Optional[str]:
        """The text of one token on its own (for the top-5 lists)."""
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    @property
    def context_length(self) -> int:
        """The positions the target can attend over: prompt and answer together."""
        return self.target.args.max_position_embeddings

    # -- decoding --------------------------------------------------------------------------

    def decoder(self, options: Optional[Options] = None, **settings) -> Decoder:
        """A decoder for these options (see `generate`)."""
        options = make(options, **settings)
        drafter = options.drafter
        if options.mtp is False:
            drafter = None
        elif drafter is None:
            if options.mtp and self.mtp_drafter is None:
                raise SettingsError("MTP needs a drafter, and none was loaded; pass mtp=False")
            drafter = self._default_drafter(options.lookup)
        return Decoder(self.target, options.sampling, drafter, options.draft_tokens, options.report, self.stop_tokens)

    def _default_drafter(self, lookup: bool) -> Optional[Drafter]:
        """Prompt lookup where the text has a match, the MTP assistant where not; either alone
        when the other is off or missing."""
        if not lookup:
            return self.mtp_drafter
        if self.mtp_drafter is None:
            return self.lookup
        return Chain([self.lookup, self.mtp_drafter])

    def stream(
        self,
        prompt: Prompt,
        options: Optional[Options] = None,
        *,
        tools: Optional[List[dict]] = None,
        cache: Optional[PromptCache] = None,
        **settings,
    ) -> Generation:
        """The answer as it settles: iterate for each token's report (see `generate` for the
        settings); `.result` holds the GenerationResult once the iteration ended. With a
        `PromptCache`, a prompt that starts like an earlier one resumes its sequence."""
        return Generation(self, prompt, make(options, **settings), tools=tools, cache=cache)

    def generate(
        self,
        prompt: Prompt,
        options: Optional[Options] = None,
        *,
        tools: Optional[List[dict]] = None,
        cache: Optional[PromptCache] = None,
        **settings,
    ) -> GenerationResult:
        """Generate up to `max_tokens` tokens (default 256); the output is exactly the target's
        alone. The settings are `Options`' fields, given as an Options object, as keywords, or
        both (keywords win):

        temperature 0 is greedy; otherwise temperature, then top_k (0: off), then top_p (1: off).
        Drafting (the default): prompt-lookup guesses where the text repeats itself, the MTP
        assistant's elsewhere (lookup=False: the assistant's only), with the number of guesses
        chosen each cycle from the measured acceptance and costs; `draft_tokens` fixes it.
        mtp=False decodes with the target alone (True insists on a loaded assistant); `drafter`
        replaces both with any object following the drafter protocol. report=False skips the
        per-token distribution figures. thinking=True lets the model think first (its thought
        comes back apart, in `result.thinking`). stop=["..."] ends the answer before the first
        of these strings (left out of the text). `tools`: OpenAI-style function declarations.
        """
        generation = self.stream(prompt, options, tools=tools, cache=cache, **settings)
        for _ in generation:
            pass
        return generation.result

    def chat(
        self, system_prompt: Optional[str] = None, tools: Optional[List[dict]] = None,
        options: Optional[Options] = None, **settings
    ) -> ChatSession:
        """A multi-turn session that keeps the caches between turns (settings as `generate`;
        max_tokens 512 unless given)."""
        base = options if options is not None else make(max_tokens=512)
        return ChatSession(self, make(base, **settings), system_prompt=system_prompt, tools=tools)

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
            report.top = [(t, p, self.token_text(t)) for t, p, _ in report.top]
            yield report


def load(
    model: str = DEFAULT_TARGET,
    drafter: Optional[str] = AUTO,
    drafter_bits: Optional[int] = None,
    drafter_mode: Optional[str] = None,
    context: int = DEFAULT_CONTEXT,
    force: bool = False,
    media: bool = False,
) -> Engine:
    """Load the Gemma 4 target and (unless `drafter` is None) its MTP assistant.

    `model`: a size by name (e2b, e4b, 26b-a4b, 31b, 12b: the 4-bit MLX conversion), a hub repo id or
    a local folder. `drafter`: "auto" (the assistant of the target's size), a size by name, a hub
    id or a folder. `drafter_bits` (4 or 8) and `drafter_mode` (affine, mxfp4, mxfp8, nvfp4)
    quantize the drafter after loading. `media=True` loads the image and audio encoders now
    (by default, with the first prompt that has media: text prompts never pay for them). Before anything is downloaded, the memory the pair needs
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
    engine = Engine(target, assistant, tokenizer, stop, target_ckpt.path, drafter_path, target_ckpt.config)
    if media:
        engine.media_encoder().load()
    return engine


def _is_messages(prompt: Prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def _ids(value) -> List[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
