"""The engine: what a user holds. It composes the model pair (models/pair.py), the text side
(text.py) and the media side (media/side.py), and answers with `generate`, `stream` and `chat`.

Data flows one way: Engine -> Generation -> Decoder -> (drafter, target, caches, sampling).
`mlx_spec.load` (loading.py) makes one from checkpoints.
"""

from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from .chat import ChatSession
from .constraints.matcher import Grammars
from .constraints.tools import with_tools
from .decoding.decoder import Decoder
from .decoding.prompt_cache import PromptCache
from .drafting import Chain, Drafter, MTPDrafter, PromptLookup
from .errors import SettingsError
from .decoding.draft_lengths import DraftLengths
from .decoding.lockstep import Lockstep
from .generation import Generation, GenerationResult
from .media.items import Prepared
from .media.prompt import has_media
from .media.side import MediaSide
from .models import FAMILIES
from .models.pair import ModelPair
from .options import Options, make
from .together import Many
from .text import TextSide, is_messages

Prompt = Union[str, Sequence[int], Sequence[Dict[str, Any]], Prepared]


class Engine:
    """A target, its drafter and their text and media sides. Create it with `mlx_spec.load`."""

    def __init__(self, pair: ModelPair, text: TextSide, media: Optional[MediaSide] = None,
                 lockstep: Optional[Lockstep] = None):
        """lockstep: the group this engine's target is split over (decoding/lockstep.py);
        none: this process alone."""
        self.pair, self.text = pair, text
        self.lockstep = lockstep or Lockstep()
        self.media = media if media is not None else MediaSide(pair.target_path, pair.target_config,
                                                              pair.family.load_media)
        self.mtp_drafter = MTPDrafter(pair.assistant, pair.target) if pair.assistant is not None else None
        self.lookup = PromptLookup()
        # What a step costs, by rows and positions: learnt once for this engine, by every
        # generation on it, alone or batched (decoding/draft_lengths.py).
        self.draft_lengths = DraftLengths(lockstep=self.lockstep)

    @classmethod
    def of(cls, target, assistant=None, tokenizer=None, stop_tokens: Sequence[int] = (), family=None,
           lockstep: Optional[Lockstep] = None) -> "Engine":
        """An engine over a target (and drafter) made in memory, as the benchmarks' random-weight
        models are; `family` is the registry's default (Gemma 4) unless given; `lockstep`: the
        group the pair was split over (its family's `split`)."""
        family = family or FAMILIES.default
        return cls(ModelPair(family, target, assistant), TextSide(tokenizer, stop_tokens, family.chat_format),
                   lockstep=lockstep)

    def with_stop_tokens(self, stop_tokens: Sequence[int]) -> "Engine":
        """This engine's models and media with exactly these stop tokens."""
        engine = Engine(self.pair, self.text.with_stop_tokens(stop_tokens), self.media, self.lockstep)
        engine.mtp_drafter, engine.lookup, engine.draft_lengths = self.mtp_drafter, self.lookup, self.draft_lengths
        return engine

    # -- what it holds ---------------------------------------------------------------------

    @property
    def target(self):
        return self.pair.target

    @property
    def assistant(self):
        return self.pair.assistant

    @property
    def target_path(self) -> Optional[Path]:
        return self.pair.target_path

    @property
    def drafter_path(self) -> Optional[Path]:
        return self.pair.drafter_path

    @property
    def tokenizer(self):
        return self.text.tokenizer

    @property
    def stop_tokens(self) -> List[int]:
        return self.text.stop_tokens

    @property
    def context_length(self) -> int:
        """The positions the target can attend over: prompt and answer together."""
        return self.target.context_length

    # -- prompts ---------------------------------------------------------------------------

    def encode(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False) -> List[int]:
        """Token ids for a prompt: ids as given, a string as text, messages through the chat
        template (see `TextSide.encode`). Messages with images or audio need `prepare`."""
        if is_messages(prompt) and has_media(prompt):
            raise SettingsError("these messages have images or audio: use prepare() for their tokens and media")
        return self.text.encode(prompt, tools, thinking)

    def prepare(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False,
                image_tokens: Optional[int] = None, allow_files: bool = True) -> Prepared:
        """Token ids for a prompt, as `encode`, and its media: each image or audio part of the
        messages becomes its begin marker, soft tokens and end marker, and a span that puts the
        media encoder's embeddings there at prefill. `image_tokens`: soft tokens per image (70,
        140, 280, 560 or 1120; the checkpoint's processor's budget when None). `allow_files`:
        whether a part may name a local file (the server allows it only when told to)."""
        if isinstance(prompt, Prepared):
            return prompt
        if not is_messages(prompt) or not has_media(prompt):
            return Prepared(self.encode(prompt, tools, thinking), [])
        return self.media.prepare(list(prompt), lambda messages: self.text.chat_tokens(messages, tools, thinking),
                                  image_tokens, allow_files)

    def render(self, prompt: Prompt, tools: Optional[List[dict]] = None, thinking: bool = False) -> Optional[str]:
        """The text `encode` tokenizes; None for token ids (see `TextSide.render`)."""
        return self.text.render(prompt, tools, thinking)

    # -- decoding --------------------------------------------------------------------------

    def decoder(self, options: Optional[Options] = None, tools: Optional[List[dict]] = None, **settings) -> Decoder:
        """The decoding loop for these options (see `generate`); `tools`: the request's, which a
        forced tool choice, or a JSON schema beside them, holds its calls to."""
        options = make(options, **settings)
        drafter = options.drafter
        if options.mtp is False:
            drafter = None
        elif drafter is None:
            if options.mtp and self.mtp_drafter is None:
                raise SettingsError("MTP needs a drafter, and none was loaded; pass mtp=False")
            drafter = self._default_drafter(options.lookup)
        sampling = options.sampling
        if sampling.seed is None and self.lockstep.size > 1:  # every rank must draw the same uniforms
            sampling = replace(sampling, seed=self.lockstep.seed())
        grammar = with_tools(options.constraint, options.tool_choice, tools, self.text.format, self.tokenizer,
                             options.thinking)
        constraint = self.grammars.matcher(grammar) if grammar is not None else None
        return Decoder(self.target, sampling, drafter, options.draft_tokens, options.report, self.stop_tokens,
                       lengths=self.draft_lengths, constraint=constraint, forced_guesses=options.drafter is None)

    @cached_property
    def grammars(self) -> Grammars:
        """What compiles this engine's constraints (its tokenizer read on the first one)."""
        tokenizer = self.tokenizer
        return Grammars(getattr(tokenizer, "_tokenizer", tokenizer), self.target.vocab_size, self.stop_tokens)

    def _default_drafter(self, lookup: bool) -> Optional[Drafter]:
        """Prompt lookup where the text has a match, the MTP assistant where not; either alone
        when the other is off or missing."""
        if not lookup:
            return self.mtp_drafter
        if self.mtp_drafter is None:
            return self.lookup
        return Chain([self.lookup, self.mtp_drafter])

    def stream(self, prompt: Prompt, options: Optional[Options] = None, *, tools: Optional[List[dict]] = None,
               cache: Optional[PromptCache] = None, **settings) -> Generation:
        """The answer as it settles: iterate for each token's report (see `generate` for the
        settings); `.result` holds the GenerationResult once the iteration ended. With a
        `PromptCache`, a prompt that starts like an earlier one resumes its sequence."""
        return Generation(self, prompt, make(options, **settings), tools=tools, cache=cache)

    def generate(self, prompt: Prompt, options: Optional[Options] = None, *, tools: Optional[List[dict]] = None,
                 cache: Optional[PromptCache] = None, **settings) -> GenerationResult:
        """Generate up to `max_tokens` tokens (Options' default: 256); the output is exactly the
        target's alone. The settings are `Options`' fields, given as an Options object, as
        keywords, or both (keywords win):

        temperature 0 is greedy; otherwise temperature, then top_k (0: off), then top_p (1: off).
        Drafting (the default): prompt-lookup guesses where the text repeats itself, the MTP
        assistant's elsewhere (lookup=False: the assistant's only), with the number of guesses
        chosen each cycle from the measured acceptance and costs; `draft_tokens` fixes it.
        mtp=False decodes with the target alone (True insists on a loaded assistant); `drafter`
        replaces both with any object following the drafter protocol. report=False skips the
        per-token distribution figures. json_schema (a mapping, or True for any JSON object),
        regex or grammar (Lark) hold the answer to them, drafting still on and exact: at every
        position the target's distribution restricted to what they allow. thinking=True lets the model think first (its thought
        comes back apart, in `result.thinking`). stop=["..."] ends the answer before the first
        of these strings (left out of the text). `tools`: OpenAI-style function declarations.
        """
        generation = self.stream(prompt, options, tools=tools, cache=cache, **settings)
        for _ in generation:
            pass
        return generation.result

    def generate_many(self, prompts: Sequence[Prompt], options: Union[None, Options, Sequence[Options]] = None, *,
                      tools: Optional[List[dict]] = None, cache: Optional[PromptCache] = None,
                      **settings) -> List[GenerationResult]:
        """Several answers at once, decoded together (see `stream_many`): each result is the
        one `generate` gives for its prompt alone."""
        answers = self.stream_many(prompts, options, tools=tools, cache=cache, **settings)
        for _ in answers:
            pass
        return answers.results

    def stream_many(self, prompts: Sequence[Prompt], options: Union[None, Options, Sequence[Options]] = None, *,
                    tools: Optional[List[dict]] = None, cache: Optional[PromptCache] = None,
                    **settings) -> Many:
        """Iterate for (index of the prompt, report) as the answers settle, decoded together: one target
        pass verifies every answer's guesses, each drafting its own (decoding/batch.py).
        `options`: one Options for all, or one per prompt; the keyword settings apply to all.
        Each answer is exactly the one it gives alone (greedy, or sampled with its own seed);
        `.results` holds them once the iteration ended."""
        if options is None or isinstance(options, Options):
            options = make(options, **settings)
        else:
            options = [make(o, **settings) for o in options]
        return Many(self, prompts, options, tools, cache)

    def chat(self, system_prompt: Optional[str] = None, tools: Optional[List[dict]] = None,
             options: Optional[Options] = None, **settings) -> ChatSession:
        """A multi-turn session that keeps the caches between turns (settings as `generate`;
        max_tokens as `ChatSession.MAX_TOKENS` unless given)."""
        base = options if options is not None else make(max_tokens=ChatSession.MAX_TOKENS)
        return ChatSession(self, make(base, **settings), system_prompt=system_prompt, tools=tools)
