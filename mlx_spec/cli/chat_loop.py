"""`mlx-spec chat`'s conversation loop: lines in, answers streamed out, slash commands between.

`/image PATH` and `/audio PATH` attach media to the next message (as content parts before its
text); the stats line after each answer counts the media's soft tokens.
"""

import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional, Sequence, Union

import click

from ..errors import ContextError, PromptStopped, SettingsError
from ..media.prompt import PLACE
from .group import UNSHARED, shared_file
from .terminal import TokenPrinter, as_utf8, prompted, read_bytes_as_escapes, stats_line

HELP = """Commands: /image PATH and /audio PATH (attach to the next message),
/reset (forget the conversation), /stats (session figures), /mtp on|off (drafting),
/thinking on|off, /help, /quit (or Ctrl-D). Ctrl-C stops the current answer.
A message that starts with "/" is typed with two ("//usr ..." sends "/usr ...")."""


def media_parts(images: Sequence[Union[str, bytes]] = (), clips: Sequence[Union[str, bytes]] = (),
                places: Sequence[str] = ()) -> List[dict]:
    """Content parts for image and audio files (their paths, or their bytes), images first.
    `places`: what errors call each (the flag and the path as given; by default its place in
    the message, as messages[0].content[1])."""
    parts = [{"type": "image", "image": p} for p in images] + [{"type": "audio", "audio": p} for p in clips]
    return [{**part, PLACE: place} for part, place in zip(parts, places)] + parts[len(places):]


def run_chat(engine, session, show_probs: bool) -> None:
    """The conversation. Under a group (decoding/lockstep.py) rank 0 reads the lines and takes
    Ctrl-C, and every rank follows them."""
    lockstep = engine.lockstep
    interactive = sys.stdin.isatty() and lockstep.leader
    printer = TokenPrinter(show_probs, sys.stdout.isatty())
    totals = {"turns": 0, "tokens": 0, "drafted": 0, "kept": 0}
    attached: List[dict] = []
    if lockstep.leader:
        read_bytes_as_escapes()
    if interactive:
        line_editing()
        click.echo(f"mlx-spec chat: {engine.target_path.name}" + (f" + {engine.drafter_path.name}" if engine.drafter_path else ""))
        click.echo(HELP)
    while True:
        line = lockstep.line(read_line(interactive) if lockstep.leader else None)
        if line is None or line.strip() in ("/quit", "/exit", "/q"):
            break
        line = line.strip()
        if not line:
            continue
        if line.startswith("/") and not line.startswith("//"):
            run_command(line, session, totals, attached)
            continue
        line = line[1:] if line.startswith("//") else line  # (a message that starts with "/")
        message = {"role": "user", "content": attached + [{"type": "text", "text": line}]} if attached else line
        with interruptible() as stopped:
            try:
                for report in session.send(message, should_stop=lambda: lockstep.flag(stopped[0])):
                    printer.print(report)
            except PromptStopped:  # Ctrl-C while the prompt went through: the turn is not kept
                click.echo(("\n" if interactive else "") + "[stopped before the answer began; the message was not kept"
                           + ("; its attachments are dropped]" if attached else "]"))
                attached.clear()  # (they went with the next, unrelated message: a review)
                continue
            except SettingsError as e:  # e.g. the conversation no longer fits: say so, go on
                click.echo(f"[{e}{advice_for(e, session)}; the message was not sent"
                           + (" and its attachments are dropped]" if attached else "]"))
                attached.clear()
                continue
        attached.clear()
        printer.end()
        stats = session.last_stats
        totals["turns"] += 1
        totals["tokens"] += stats.generated_tokens
        totals["drafted"] += stats.drafted
        totals["kept"] += stats.kept
        if stopped[0]:
            click.echo("[stopped]")
        click.echo(stats_line(stats))


def advice_for(error: SettingsError, session) -> str:
    """What the user may do about a turn refused: /reset where the conversation before it is what
    does not fit, nothing it could change otherwise."""
    if not isinstance(error, ContextError):
        return ""
    said = [m for m in session.messages if m.get("role") != "system"]
    return "; /reset starts over" if said else "; shorten the message"


def read_line(interactive: bool) -> Optional[str]:
    while True:
        try:
            line = prompted(">> ") if interactive else sys.stdin.readline()
            if not line and not interactive:
                return None
            text = as_utf8(line)
            if text != line:
                click.echo("[bytes that are not UTF-8 were read as \ufffd]")
            return text
        except EOFError:  # Ctrl-D: the shell's prompt on a line of its own
            if interactive:
                click.echo()
            return None
        except KeyboardInterrupt:  # at the prompt: a fresh line, like a shell
            click.echo()


def run_command(line: str, session, totals: dict, attached: List[dict]) -> None:
    parts = line.split(maxsplit=1)
    name = parts[0]
    if name in ("/image", "/audio"):
        attach(name, parts[1].strip() if len(parts) == 2 else "", session, attached)
    elif name == "/reset":
        session.reset()
        attached.clear()
        click.echo("[conversation cleared]")
    elif name == "/stats":
        kept = f"{totals['kept']}/{totals['drafted']}"
        click.echo(
            f"[session: {totals['turns']} turns, {totals['tokens']} tokens, guesses kept {kept}, "
            f"{session.state.cached} positions cached, mtp {'off' if session.options.mtp is False else 'on'}, "
            f"thinking {'on' if session.thinking else 'off'}]"
        )
    elif name == "/mtp" and len(parts) == 2 and parts[1] in ("on", "off"):
        session.set(mtp=None if parts[1] == "on" else False)
        alone = parts[1] == "on" and session.engine.mtp_drafter is None  # (--no-mtp loads none)
        click.echo("[mtp on: prompt lookup only, no assistant was loaded]" if alone else f"[mtp {parts[1]}]")
    elif name == "/thinking" and len(parts) == 2 and parts[1] in ("on", "off"):
        session.set(thinking=parts[1] == "on")
        click.echo(f"[thinking {parts[1]}]")
    elif name == "/help":
        click.echo(HELP)
    else:
        click.echo(f"[unknown command {line!r}; /help lists them]")


def attach(name: str, argument: str, session, attached: List[dict]) -> None:
    """/image PATH or /audio PATH: the file is read and checked now (a text-only model, a file
    that is no image), not when the message it was meant for is sent and refused with it."""
    if not argument:
        click.echo(f"[{name} needs a PATH: {name} photo.png]")
        return
    path = file_named(argument)
    lockstep = session.engine.lockstep
    if lockstep.size == 1 and not path.is_file():
        click.echo(f"[{path}: {'a folder, not a file' if path.is_dir() else 'no such file'}]")
        return
    # Under a group rank 0 reads the file and every rank takes its bytes (the others may not have it).
    value = shared_file(lockstep, str(path)) if lockstep.size > 1 else str(path)
    if value is None:
        click.echo(f"[{path}: {UNSHARED}]")
        return
    place = [f"{name} {argument}"]
    part = media_parts([value], (), place) if name == "/image" else media_parts((), [value], place)
    try:
        session.engine.prepare([{"role": "user", "content": part}], image_tokens=session.options.image_tokens)
    except SettingsError as e:  # (a MediaError among them)
        click.echo(f"[{e}; not attached]")
        return
    attached.extend(part)
    click.echo(f"[{name[1:]} {path.name} attached to the next message ({len(attached)} in all)]")


def file_named(argument: str) -> Path:
    """The file an argument names: as typed, or read as a shell reads it (quotes and backslashes,
    as a terminal writes a file dragged into it) where that names one and the text as typed does not."""
    typed = Path(argument).expanduser()
    try:
        words = shlex.split(argument)
    except ValueError:  # (an unmatched quote)
        return typed
    unquoted = Path(words[0]).expanduser() if len(words) == 1 else typed
    return unquoted if unquoted.exists() and not typed.exists() else typed


@contextmanager
def interruptible():
    """While answering, Ctrl-C asks the answer to stop after the current token (the caches stay
    consistent) instead of raising in the middle of a cycle."""
    stopped = [False]

    def handler(signum, frame):
        stopped[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def line_editing() -> None:
    """Arrow keys and history at the prompt, and lines as long as they come: without readline a
    terminal cuts a line at its own limit (4,095 bytes on Linux, 1,024 on macOS) without a word."""
    try:
        import readline  # noqa: F401  (input() uses it once it is imported)
    except ImportError:  # (Python built without it)
        pass
