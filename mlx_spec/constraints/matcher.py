"""A request's constraint in the loop: llguidance's matcher, walked along a row's guesses for
the mask at every verified position, then left at the tokens the row settled.

Why llguidance (docs/structured-output.md): one small wheel with no dependencies (3 MB, macOS
arm64 and Linux), the matcher llama.cpp, vLLM and SGLang use, with rollback made for speculative
decoding, JSON Schema, regular expressions and Lark grammars. It is imported only when a request
asks for a constraint: a chat that never does pays nothing for it.

How a cycle is constrained, exactly: the host knows the row's settled tokens and its guesses
(synced before the target pass is built). The matcher gives the mask at the settled point, then
consumes the guesses one by one, giving the mask after each, and rolls back to the settled
point. A guess the grammar forbids ends the walk: the target's restricted distribution never
draws it, so no guess after it is kept, and the positions after it take the last mask (they are
computed and cut as any rejected guess's). At the settle, the matcher consumes the tokens the
row keeps: the guesses kept, and the target's own draw, which its mask allowed.

A stop token is allowed where the grammar is complete (llguidance's end of sequence is every stop
token of the model's), and never consumed: it ends the answer.
"""

from typing import List, Optional, Sequence

import numpy as np

from ..errors import SettingsError
from ..sampling.masks import words_for
from .spec import Grammar

COMPACT = {"whitespace_flexible": False}  # JSON without free whitespace (a model may else write spaces to its limit)


class Grammars:
    """Compiles constraints for one model's tokenizer: the tokenizer is read once, on the first
    constraint (about a second for a 262,144-token vocabulary), and kept."""

    def __init__(self, tokenizer, vocab_size: int, stop_tokens: Sequence[int]):
        """tokenizer: the Hugging Face tokenizer (None: the model has none, and no constraint
        can be read as text)."""
        self.hf_tokenizer, self.vocab_size, self.stop_tokens = tokenizer, vocab_size, sorted(set(stop_tokens))
        self._ll_tokenizer = None

    def matcher(self, grammar: Grammar) -> "Matcher":
        """A fresh matcher for one answer under `grammar`; a SettingsError naming what is wrong
        with a grammar the library refuses."""
        import llguidance

        if self.hf_tokenizer is None:
            raise SettingsError("a constraint needs the model's tokenizer, and this checkpoint has none")
        if not self.stop_tokens:
            raise SettingsError("a constraint needs a stop token to end the answer where the grammar is complete")
        text = _grammar_text(llguidance.LLMatcher, grammar)
        try:
            matcher = llguidance.LLMatcher(self._tokenizer(), text)
        except BaseException as e:  # (a panic in the library's Rust is a BaseException)
            raise _refused(grammar, e)
        if matcher.is_error():
            raise SettingsError(f"the {grammar.kind.replace('_', ' ')} cannot be used: {one_line(matcher.get_error())}")
        ready = Matcher(matcher, self.vocab_size, self.stop_tokens)
        ready.masks([])  # the first mask, now: a grammar the matcher cannot start on is refused before any work
        return ready

    def _tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size,
                                                              eos_token=self.stop_tokens)
        return self._ll_tokenizer


def _grammar_text(LLMatcher, grammar: Grammar) -> str:
    try:
        if grammar.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(grammar.source, defaults=COMPACT)
        if grammar.kind == "regex":
            return LLMatcher.grammar_from_regex(grammar.source)
        return LLMatcher.grammar_from_lark(grammar.source)
    except BaseException as e:  # (a panic in the library's Rust is a BaseException)
        raise _refused(grammar, e)


def _refused(grammar: Grammar, error: BaseException) -> BaseException:
    """A SettingsError naming what the library refused (an interrupt stays one)."""
    if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return error
    return SettingsError(f"the {grammar.kind.replace('_', ' ')} cannot be used: {one_line(str(error))}")


def one_line(message: str, most: int = 300) -> str:
    """llguidance's message (several lines, a caret under the place) as one line."""
    message = message.split("<state>", 1)[0]  # (its parser's dump follows)
    lines = [line.strip() for line in message.splitlines()]
    text = "; ".join(line for line in lines if line and not set(line) <= set("^|0123456789 "))
    return text if len(text) <= most else text[: most - 3] + "..."


class Matcher:
    """One answer's place in its grammar, at the tokens it settled."""

    def __init__(self, matcher, vocab_size: int, stop_tokens: Sequence[int]):
        import llguidance.numpy

        self.matcher, self.vocab_size, self.stop_tokens = matcher, vocab_size, set(stop_tokens)
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self.settled: List[bool] = []  # per settled token: whether it was consumed (a stop token is not)

    @property
    def words(self) -> int:
        return words_for(self.vocab_size)

    def masks(self, guesses: Sequence[int], positions: Optional[int] = None) -> tuple:
        """(int32 [positions, words], usable): the allowed tokens at the settled point and after
        each guess the grammar allows (see the module's note; positions defaults to guesses + 1),
        and how many of the guesses may be kept: all, but where the matcher failed walking one
        (one of its limits, on a guess the row may never keep), the guesses from that one on,
        which the loop then never keeps. The walk is on a copy: a guess never moves or breaks the
        row's own matcher."""
        positions = len(guesses) + 1 if positions is None else positions
        out = np.zeros((positions, self.words), dtype=np.int32)
        self._fill(self.matcher, out, 0)
        self._check()
        if not out[0].any():  # (a matcher past one of its limits allows nothing: never a NaN distribution)
            raise SettingsError("the grammar allows no token here: the matcher gave up on it (too large a grammar?)")
        walked, usable = 0, len(guesses)
        walker = self.matcher.deep_copy() if len(guesses) and positions > 1 else None
        for guess in guesses[: positions - 1]:
            if guess in self.stop_tokens or walker.try_consume_tokens([guess]) != 1:
                usable = walked if walker.is_error() else usable
                break
            self._fill(walker, out, walked + 1)
            if walker.is_error():
                usable = walked
                break
            walked += 1
        out[walked + 1:] = out[walked]
        return out, usable

    def forced(self, most: int) -> List[int]:
        """Up to `most` tokens the grammar forces next (llguidance's fast-forward tokens; never
        a stop token)."""
        out = []
        try:
            forced = self.matcher.compute_ff_tokens()[:most]
        except BaseException as e:  # (its own failure is the masks' to report, at the same point)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return []
        for token in forced:
            if token in self.stop_tokens:
                break
            out.append(token)
        return out

    def advance(self, tokens: Sequence[int]) -> None:
        """The row settled `tokens` (each allowed by its mask): the matcher moves past them."""
        for token in tokens:
            consumed = token not in self.stop_tokens  # (a stop token ends the answer)
            if consumed and self.matcher.try_consume_tokens([token]) != 1:
                self._check()  # (the matcher past one of its limits)
                raise RuntimeError(f"token {token} was settled against its grammar's mask")
            self.settled.append(consumed)
        self._check()

    def take_back(self, n: int) -> None:
        """The row's last `n` settled tokens go back (never handed over): so does the matcher."""
        back = self.settled[len(self.settled) - n:] if n > 0 else []
        if sum(back):
            self.matcher.rollback(sum(back))
        del self.settled[len(self.settled) - len(back):]

    def _check(self) -> None:
        """A SettingsError where the matcher failed on the grammar (one of its limits, a grammar it
        cannot extend): the request's, not a fault of the loop."""
        if self.matcher.is_error():
            raise SettingsError(f"the grammar's matcher gave up: {one_line(self.matcher.get_error())}")
