"""The one request path: a prompt and its `Options` in, reports and a `GenerationResult` out.

`Engine.generate` and `Engine.stream`, chat sessions, the command line and the server all go
through `Generation`. It owns what every front end would otherwise write again:
- the context check (the prompt and the tokens asked for must fit the model's positions, or
  the answer is cut to what they leave when the options say so);
- the sequence to decode in (a chat session's own, or one from a prompt cache, given back
  whatever happens);
- stop strings, checked on the text across token boundaries and left out of it;
- building the result.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .decoding.prompt_cache import PromptCache
from .decoding.reports import WAITING, TokenReport
from .decoding.sequence import SequenceState
from .decoding.stats import Stats
from .errors import ContextError, PromptStopped, SettingsError
from .models.protocol import ANSWER, THOUGHT
from .options import Options


@dataclass
class GenerationResult:
    tokens: List[int]  # generated ids, a stop token included when one ended the answer
    text: str  # the answer: no thought, no tool-call markup, no stop token or string
    steps: List[TokenReport]
    stats: Stats
    # "tool_calls", "stop" (a stop token or string), "length" (max_tokens, or the context's end) or
    # "cancelled" (the caller ended it first: a stream left early, a chat's should_stop)
    finish_reason: str
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)  # [{"id", "name", "arguments"}]
    thinking: str = ""  # the thought, when thinking was on and the model thought




def tokens_to_generate(prompt_tokens: int, options: Options, context: int) -> int:
    """How many tokens the answer may have: `options.max_tokens`, or with `fit_context` what
    the context leaves, if less. A prompt that leaves no room is refused either way."""
    room = context - prompt_tokens
    if room < 1 or (options.max_tokens > room and not options.fit_context):
        raise ContextError(prompt_tokens, options.max_tokens if room >= 1 else max(options.max_tokens, 1), context)
    return min(options.max_tokens, room)


class Generation:
    """One answer. `start()` puts the prompt through the model (errors come from there);
    iterating yields the reports of the tokens the caller may see; `result` is there once the
    iteration ended (done, stopped, or left early). In a batch (`batch`, see together.py) the
    iteration also gives WAITING whenever nothing settled since the batch's last step.

    as_written: stop strings are checked on the text as the model wrote it (channel markers and
    labels kept, every channel), as a raw completion returns it; otherwise on the answer."""

    def __init__(self, engine, prompt, options: Options, *, tools: Optional[List[dict]] = None,
                 state: Optional[SequenceState] = None, cache=None, as_written: bool = False,
                 stop: Optional[Callable[[], bool]] = None, stop_after_token: Optional[Callable[[], bool]] = None,
                 batch=None):
        if cache is not None and not isinstance(cache, PromptCache):
            raise SettingsError(f"cache must be a mlx_spec.PromptCache, got {type(cache).__name__}")
        self.engine, self.prompt, self.options, self.tools = engine, prompt, options, tools
        self.state, self.cache, self.as_written = state, cache, as_written
        self.stop = stop  # asked between prefill chunks: True stops the prompt (PromptStopped)
        # Asked after each token the decoder settles, before any text is held back (a tool
        # call's block, a stop string's start): True ends the answer there.
        self.stop_after_token = stop_after_token
        # A Batch (decoding/batch.py) to decode in with other requests: iterating then gives
        # WAITING whenever this answer has nothing new until the batch's next step.
        self.batch = batch
        self.decoder = engine.decoder(options, tools)
        self.stops = StopStrings(list(options.stop), None if as_written else (ANSWER,))
        self.prompt_tokens: Optional[int] = None
        self.prompt_ids: List[int] = []  # the prompt's last token ids (a chat format reads its channel there)
        self.limit = 0
        self.released: List[TokenReport] = []
        self.result: Optional[GenerationResult] = None
        self.reading = False  # iterated (once only)

    @property
    def text(self) -> str:
        """The text the stop strings were checked on, up to the first stop string."""
        return self.stops.text

    def start(self) -> int:
        """Encode the prompt, check that it fits, and put it through the model; returns its
        length in tokens. A prompt that cannot fit changes nothing."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        tokens, spans = self.engine.prepare(self.prompt, self.tools, self.options.thinking, self.options.image_tokens)
        self.limit = tokens_to_generate(len(tokens), self.options, self.engine.context_length)
        self.decoder.check_prompt(tokens)  # before a cached sequence is taken: a bad id must not cost it
        if self.state is None:
            self.state = self.cache.take(tokens, spans)[0] if self.cache is not None else SequenceState(self.engine.target)
        try:
            self.decoder.start(self.state, tokens, spans, self.stop)
        except PromptStopped:
            self.close()  # the part that went through goes back to the prompt cache, consistent
            raise
        except BaseException:
            self.cache = None  # a failed prompt's sequence never goes back to the prompt cache
            raise
        self.prompt_tokens, self.prompt_ids = len(tokens), list(tokens[-16:])
        return self.prompt_tokens

    def __iter__(self) -> Iterator[TokenReport]:
        if self.result is not None:  # its sequence went back: iterating again would decode on it
            raise SettingsError("this answer was read to its end already (its result is .result); "
                                "a new Generation answers again")
        if self.reading:  # two readers would decode on the one sequence, each from its own place
            raise SettingsError("this answer is being read already: iterate a Generation once")
        self.start()
        self.reading = True  # (after: a prompt that failed may be started again)
        if self.batch is not None:
            source = self.batch.join(self.decoder, self.state, self.limit)
        else:
            source = self.decoder.generate(self.state, self.limit)
        stream = self.engine.text.with_text(self._until_stopped(source) if self.stop_after_token else source,
                                            self.tools, self.prompt_ids)
        try:
            for step in stream:
                if step is WAITING:
                    yield step
                    continue
                yield from self._release(self.stops.feed(dataclasses.replace(step, text=step.raw) if self.as_written else step))
                if self.stops.hit:
                    break
            yield from self._release(self.stops.flush())
        finally:
            stream.close()  # now, not when collected: the caches hold exactly what was handed over
            source.close()
            self.close()
            self.result = build_result(self.engine, self.released, self.decoder.stats, self.stops.hit, self.limit,
                                       self.tools)

    def _until_stopped(self, source: Iterator[TokenReport]) -> Iterator[TokenReport]:
        for report in source:
            yield report
            if report is not WAITING and self.stop_after_token():
                return

    def _release(self, reports: List[TokenReport]) -> Iterator[TokenReport]:
        for report in reports:
            self.released.append(report)
            yield report

    def close(self) -> None:
        """Give the sequence back to the prompt cache (once): at the end of the iteration, or
        by a caller that started the prompt and will not iterate. Close an iteration that
        began before (its own end gives the sequence back, the caches cut to what it handed
        over)."""
        if self.cache is not None and self.state is not None:
            self.cache.give_back(self.state)
            self.cache = None  # once


def build_result(engine, steps: List[TokenReport], stats: Stats, stopped_by_string: bool = False,
                 limit: Optional[int] = None, tools: Optional[List[dict]] = None) -> GenerationResult:
    """The result of a finished generation from the reports handed out. `limit`: the tokens it
    could have made; an answer short of it that no stop ended was cancelled (None: not known)."""
    tokens = [s.token for s in steps]
    calls = engine.text.format.parse_tool_calls(engine.text.text_of(tokens), tools)
    if calls:
        finish = "tool_calls"
    elif stopped_by_string or (tokens and tokens[-1] in engine.stop_tokens):
        finish = "stop"
    else:
        finish = "length" if limit is None or len(tokens) >= limit else "cancelled"
    text = "".join(s.text or "" for s in steps if s.channel == ANSWER)
    thinking = "".join(s.text or "" for s in steps if s.channel == THOUGHT)
    return GenerationResult(tokens, text, steps, stats, finish, calls, thinking)


class StopStrings:
    """Holds back tokens while their text could still become a stop string; on one, releases
    the text before it and says so. Only text in `channels` counts (None: every channel)."""

    def __init__(self, stops: List[str], channels: Optional[Tuple[str, ...]] = (ANSWER,)):
        self.stops, self.channels = stops, channels
        self.longest = max((len(s) for s in stops), default=0)
        self.text = ""
        self.searched = 0  # stop strings cannot start before this
        self.pending: List[Tuple[TokenReport, int, int]] = []  # (report, start, end) in self.text
        self.hit = False
        self.matched: Optional[str] = None  # the stop string that ended the text, once one did

    def feed(self, report: TokenReport) -> List[TokenReport]:
        start = len(self.text)
        if report.text and (self.channels is None or report.channel in self.channels):
            self.text += report.text
        self.pending.append((report, start, len(self.text)))
        if not self.stops:
            return self._release(len(self.text))
        found = [(i, s) for i, s in ((self.text.find(s, self.searched), s) for s in self.stops) if i >= 0]
        if found:
            at, self.matched = min(found)
            self.hit = True
            return self._cut(at)
        held = held_back(self.text, self.stops, self.longest)
        self.searched = max(self.searched, len(self.text) - self.longest + 1, 0)
        return self._release(len(self.text) - held)

    def flush(self) -> List[TokenReport]:
        return self._release(len(self.text))

    def _release(self, upto: int) -> List[TokenReport]:
        out = []
        while self.pending and self.pending[0][2] <= upto:
            out.append(self.pending.pop(0)[0])
        return out

    def _cut(self, at: int) -> List[TokenReport]:
        out = []
        for report, start, end in self.pending:
            if start > at or (start == at and end > start):  # the stop string's own text, or after it
                break
            out.append(report if end <= at else dataclasses.replace(report, text=report.text[: at - start]))
        self.pending = []
        self.text = self.text[:at]
        return out


def held_back(text: str, stops: List[str], longest: int) -> int:
    """How many characters at the end of `text` may still begin a stop string: its longest end,
    shorter than the longest stop string, that one of them starts with. Only a place holding a
    stop string's first character can begin it, so only those are tried, and the earliest
    (longest) first: this runs for every token on the model's thread, where trying every
    length cost a thousand steps a token for one stop string of a thousand characters."""
    begin, held = max(len(text) - longest + 1, 0), 0
    for stop in stops:
        at = text.find(stop[0], begin)
        while at != -1 and len(text) - at > held:
            if stop.startswith(text[at:]):
                held = len(text) - at
                break
            at = text.find(stop[0], at + 1)
    return held
