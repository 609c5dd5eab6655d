"""`mlx-spec chat` as a person at a terminal has it: a real pseudo-terminal (pexpect), so that
standard input is a terminal and readline edits the line; and the chat loop's handling of
attachments and of lines that start with "/"."""

import io
import os
import re
import sys
import time

import pytest

from mlx_spec import load
from mlx_spec.errors import PromptStopped

pexpect = pytest.importorskip("pexpect", reason="pexpect is in the test extra: pip install -e '.[test]'")


def chat_command(checkpoints, *flags):
    return (f"{sys.executable} -m mlx_spec chat --model {checkpoints['text']} --drafter {checkpoints['assistant']} "
            + " ".join(flags))


def test_a_long_line_is_read_whole_with_the_answers_piped(checkpoints):
    """`mlx-spec chat | tee log`: Python's input() edits with readline only when standard output
    is a terminal too, so the terminal's own line buffer cut a 4,299-character line to its
    first 4,095 bytes without a word (found by a review). Ctrl-D then ends the chat on a line
    of its own."""
    line = ("word " * 860).strip()
    whole = len(load(str(checkpoints["text"]), str(checkpoints["assistant"])).encode([{"role": "user", "content": line}]))
    chat = pexpect.spawn("/bin/bash", ["-c", chat_command(checkpoints, "--max-tokens", "3") + " | cat"],
                         env=dict(os.environ, TERM="xterm"), encoding="utf-8", codec_errors="replace", timeout=120,
                         dimensions=(50, 200))
    # The prompt goes to the terminal itself and the rest through the pipe (and `cat`), so the
    # two may come in either order on the screen: the text is read until both have come.
    try:
        seen = until(chat, 'sends "/usr ...").', "> ")  # (the banner; readline reads the line now: typed
        chat.sendline(line)                              # before it, the terminal would cut it)
        seen = until(chat, "shorten the message", "> ")  # (/reset would not help: the conversation is empty)
        counted = re.search(r"\[prompt too long: (\d+) tokens", seen)  # (past the 4,096 positions, whole)
        assert counted and int(counted.group(1)) == whole, seen[-500:]
        chat.sendcontrol("d")
        chat.expect(pexpect.EOF)
        assert "\n" in chat.before and not chat.before.strip(), repr(chat.before)
    finally:
        chat.close(force=True)


def until(chat, *pieces, timeout=120):
    """What the terminal shows from here until every piece has shown, in any order."""
    seen, deadline = "", time.monotonic() + timeout
    while not all(piece in seen for piece in pieces):
        assert time.monotonic() < deadline, f"waited for {pieces}; the terminal showed {seen[-500:]!r}"
        try:
            seen += chat.read_nonblocking(100_000, timeout=1)
        except pexpect.TIMEOUT:
            pass
    return seen


def run_lines(engine, lines, monkeypatch, send=None):
    """The chat loop over these lines (standard input not a terminal), its output, and the
    messages each turn sent."""
    from mlx_spec.cli.chat_loop import run_chat

    session = engine.chat(max_tokens=2)
    sent = []
    real = session.send

    def recorded(message, **kwargs):
        sent.append(message)
        return send(real, message, **kwargs) if send else real(message, **kwargs)

    monkeypatch.setattr(session, "send", recorded)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    run_chat(engine, session, show_probs=False)
    return out.getvalue(), sent


def test_attachments_are_checked_when_attached(multimodal, checkpoints, tmp_path, monkeypatch):
    """/image and /audio said "attached" for any file, even on a text-only model; the message
    they went with was then refused, and lost with them (found by a review). A path is read as a
    shell reads it (a file dragged into a terminal comes quoted or with backslashes)."""
    from PIL import Image

    folder = tmp_path / "my pictures"
    folder.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(folder / "red pic.png")
    (tmp_path / "notes.png").write_text("not an image")
    engine = load(str(multimodal["text"]), str(multimodal["assistant"]))
    out, sent = run_lines(engine, [
        "/image", f"/image {tmp_path / 'notes.png'}", f"/image {folder}", f"/image '{folder / 'red pic.png'}'",
        "//usr is a folder"], monkeypatch)
    assert "[/image needs a PATH" in out
    assert f"/image {tmp_path / 'notes.png'}: not an image Pillow can read" in out and "not attached" in out
    assert f"[{folder}: a folder, not a file]" in out
    assert "[image red pic.png attached to the next message (1 in all)]" in out
    (message,) = sent
    assert [p["type"] for p in message["content"]] == ["image", "text"]
    assert message["content"][-1]["text"] == "/usr is a folder"  # ("//": a message that starts with "/")

    text_only = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    out, sent = run_lines(text_only, [f"/image '{folder / 'red pic.png'}'", "Hi"], monkeypatch)
    assert "a text-only checkpoint" in out and "not attached" in out
    assert sent == ["Hi"]


def test_a_message_stopped_in_its_prompt_drops_its_attachments(multimodal, tmp_path, monkeypatch):
    """Ctrl-C while a message with an image went through the model: the message was not kept,
    but its image went with the next, unrelated message (found by a review)."""
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "red.png")
    engine = load(str(multimodal["text"]), str(multimodal["assistant"]))
    stopped = []

    def stopped_once(real, message, **kwargs):
        if not stopped:  # (as Ctrl-C in the prompt ends a turn: tests/test_stopped_prompt.py)
            stopped.append(message)
            raise PromptStopped("stopped")
        return real(message, **kwargs)

    out, sent = run_lines(engine, [f"/image {tmp_path / 'red.png'}", "What is it?", "Just text now"], monkeypatch,
                          send=stopped_once)
    assert "[stopped before the answer began; the message was not kept; its attachments are dropped]" in out
    assert sent[1] == "Just text now"
