"""Chat sessions that keep the target's caches across turns.

Each turn renders the whole conversation with the tokenizer's chat template. The session goes
back to the longest token prefix it shares with that rendering and sends only the rest through
the target (`Decoder.start`). With Google's template the rendering never extends what the
session holds: the history leaves out the thought channel that ended the last prompt or began
the last answer, and re-renders tool calls. So every turn goes back into the last answer, to a
mark kept at the end of the last prompt, and the rest of the answer is processed again:
never wrong, and never more than the new turn, the last answer and a few tokens.
"""

from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from .decoding.reports import TokenReport
from .decoding.sequence import SequenceState
from .decoding.stats import Stats
from .errors import SettingsError
from .generation import Generation
from .options import Options

__all__ = ["ChatSession", "tool_result"]
Message = Dict[str, Any]

def tool_result(name: str, content: Any, tool_call_id: Optional[str] = None) -> Message:
    """A tool's result as a chat message. A mapping is rendered natively
    (`response:NAME{key:value}`), a string as `response:NAME{value:...}`."""
    message: Message = {"role": "tool", "name": name, "content": content}
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    return message



class ChatSession:
    """A conversation with an `Engine`, its caches kept between turns.

    session = engine.chat(system_prompt="Be brief.", tools=[...], thinking=False)
    for report in session.send("What time is it in Taipei?"): print(report.text, end="")
    for call in session.last_tool_calls:  # answer them, in order
        session.send(tool_result(call["name"], {...}, call["id"]))  # or a list of results at once
    """

    MAX_TOKENS = 512  # tokens per answer unless the options say otherwise (`Engine.chat`, mlx-spec chat)

    def __init__(self, engine, options: Options, system_prompt: Optional[str] = None, tools: Optional[List[dict]] = None):
        engine.text.require_tokenizer("a chat session")
        self.engine = engine
        self.system_prompt = system_prompt
        self.tools = tools
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise SettingsError(f"system_prompt must be a string, got {type(system_prompt).__name__} "
                                "(options go by name: engine.chat(options=...))")
        # A long answer ends where the model's context does.
        self.options = options.but(fit_context=True)
        self._check(self.options)
        self.last_result = None  # the GenerationResult of the last answer
        self._open_turn: Optional[Iterator[TokenReport]] = None  # a turn whose stream was left open
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system prompt and tools stay)."""
        self._end_turn(self._open_turn)  # (before the history it would add to goes)
        self._open_turn = None
        self.messages: List[Message] = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        self.state = SequenceState(self.engine.target)

    def set(self, **settings) -> None:
        """Change settings for the next turns (e.g. mtp=False, thinking=True); the caches stay."""
        options = self.options.but(**settings)
        self._check(options)
        self.options = options

    def _check(self, options: Options) -> None:
        """Settings the model refuses (a top_k past its vocabulary, MTP without a drafter) fail
        now, not at every turn. (A seed is given: a group's ranks would agree on one.)"""
        self.engine.decoder(options.but(seed=0))

    @property
    def thinking(self) -> bool:
        return self.options.thinking

    @property
    def last_stats(self) -> Optional[Stats]:
        return self.last_result.stats if self.last_result else None

    @property
    def last_tool_calls(self) -> List[Dict[str, Any]]:
        return self.last_result.tool_calls if self.last_result else []

    def send(
        self,
        message: Union[str, Message, List[Message]],
        max_tokens: Optional[int] = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[TokenReport]:
        """Add a user message (or message dicts, e.g. the results of the last answer's tool
        calls) and stream the answer.

        `should_stop` is checked between the prompt's chunks and after every token; when it
        returns True the answer ends there and the session stays consistent for the next turn.
        Stopped before the answer began, the turn raises PromptStopped and is not kept, as a
        turn that fails is not (the conversation is as it was before `send`). A turn whose
        stream is still open when the next one starts ends there, as if it had been stopped.
        """
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        new = list(message) if isinstance(message, (list, tuple)) else [message]
        if not new:
            raise SettingsError("send needs a message: an empty list adds nothing to answer")
        for item in new:  # (a list of ints would otherwise read as a prompt of token ids)
            if not isinstance(item, dict):
                raise SettingsError(f"send takes a user message (a string) or message dicts, got {type(item).__name__}")
        options = self.options if max_tokens is None else self.options.but(max_tokens=max_tokens)
        self._open_turn = self._answer(new, options, should_stop, self._open_turn)
        return self._open_turn

    def _answer(self, new: List[Message], options: Options, should_stop: Callable[[], bool],
                previous: Optional[Iterator[TokenReport]]) -> Iterator[TokenReport]:
        try:
            self._end_turn(previous)
        except SettingsError:
            self._open_turn = previous  # (still open: the next turn ends it)
            raise
        before = len(self.messages)
        self.messages.extend(new)
        try:
            generation = Generation(self.engine, self.messages, options, tools=self.tools, state=self.state,
                                    stop=should_stop, stop_after_token=should_stop)
            generation.start()
        except BaseException:  # (Ctrl-C in a notebook too) the state holds a consistent prefix
            del self.messages[before:]
            raise
        stream = iter(generation)
        try:
            yield from stream  # (it asks should_stop after every token: a held tool call too)
        finally:
            stream.close()
            self.last_result = result = generation.result
            self.messages.append(self.engine.text.format.assistant_message(result.text, result.tool_calls,
                                                                         result.thinking))

    @staticmethod
    def _end_turn(turn: Optional[Iterator[TokenReport]]) -> None:
        """End a turn whose stream was left open (its answer is kept as far as it was read): two
        turns decoding on the session's one sequence would corrupt it."""
        if turn is None:
            return
        try:
            turn.close()
        except ValueError:  # (one being read right now, by another thread, cannot be closed)
            raise SettingsError("the last turn is still being answered: send the next one after its "
                                "loop, or break out of it first") from None
