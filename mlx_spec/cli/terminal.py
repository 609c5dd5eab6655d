"""What the command line prints: tokens as they settle (with their probabilities, on request)
and the figures of an answer."""

import os
import sys

import click


def as_utf8(text: str) -> str:
    """Text read from a terminal, a pipe or the arguments as Unicode the tokenizer takes: bytes
    that are not UTF-8 (which Python keeps as lone surrogates) become U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # (a surrogate that escapes no byte)
        return text.encode("utf-8", "replace").decode("utf-8")


def prompted(prompt: str) -> str:
    """input(prompt) at a terminal, with readline even where standard output is a pipe (`chat |
    tee log`). Python's input() edits with readline only when its standard output is a terminal
    too; otherwise the terminal's own line buffer cuts a line at 4,095 bytes without a word. So
    for the call, file descriptor 1 is the terminal: the prompt and the line being edited show
    there, and the pipe gets the answers alone."""
    if sys.stdout.isatty():
        return input(prompt)
    try:
        terminal = os.open("/dev/tty", os.O_WRONLY)
    except OSError:  # (no controlling terminal)
        return input(prompt)
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(terminal, 1)
        return input(prompt)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(terminal)


def read_bytes_as_escapes() -> None:
    """Standard input keeps bytes that are not UTF-8 (for `as_utf8`) instead of raising at them
    (a strict UTF-8 locale)."""
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")


def stats_line(stats) -> str:
    kept = "no drafting"
    if stats.drafted:
        sources = ", ".join(
            f"{name} {stats.kept_by_source.get(name, 0)}/{n}" for name, n in sorted(stats.drafted_by_source.items())
        )
        kept = f"guesses kept {stats.kept}/{stats.drafted} ({sources}; {stats.mean_g:.1f} per cycle)"
    gb = stats.peak_memory_gb
    memory = f"{gb:.2f} GB" if gb >= 1 else f"{gb * 1000:.0f} MB"
    return (
        f"[{stats.generated_tokens} tokens, {stats.generation_tps:.1f} tok/s, "
        f"prompt {stats.prompt_length} tokens ({stats.prompt_tokens} processed at {stats.prompt_tps:.1f} tok/s, "
        f"{stats.prompt_reused} reused" + (f", {stats.media_tokens} of images and audio" if stats.media_tokens else "")
        + f"), {kept}, "
        f"peak memory {memory}]"
    )


class TokenPrinter:
    """Prints tokens as they settle. A thought is dimmed in a terminal and set between
    `[thinking]` and `[/thinking]` lines when piped; a tool call shows as `[tool call: ...]`.
    With --show-probs: in a terminal, colour by probability (green likely, yellow unsure, red
    unlikely) and underline kept guesses; when piped, [probability%, * for a kept guess] after
    each token."""

    def __init__(self, show_probs: bool, terminal: bool):
        self.show_probs, self.terminal = show_probs, terminal
        self.channel = "answer"

    def print(self, report) -> None:
        self._switch(report.channel)
        text = report.text or ""
        if self.show_probs and report.prob is not None and text:
            if self.terminal:
                colour = "green" if report.prob >= 0.8 else "yellow" if report.prob >= 0.3 else "red"
                text = click.style(text, fg=colour, underline=report.drafted, dim=report.channel == "thought")
            else:
                text = f"{text}[{100 * report.prob:.0f}%{'*' if report.drafted else ''}]"
        elif self.terminal and report.channel == "thought":
            text = click.style(text, dim=True)
        click.echo(text, nl=False)
        sys.stdout.flush()

    def _switch(self, channel: str) -> None:
        if channel == self.channel:
            return
        closing = {"thought": "[/thinking]\n" if not self.terminal else "\n", "tool_call": "]"}
        opening = {"thought": "[thinking]\n" if not self.terminal else "", "tool_call": "[tool call: "}
        click.echo(closing.get(self.channel, "") + opening.get(channel, ""), nl=False)
        self.channel = channel

    def end(self) -> None:
        """After an answer: close an open channel and the line."""
        self._switch("answer")
        click.echo()
