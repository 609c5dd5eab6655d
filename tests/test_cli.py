"""`mlx-spec chat` and `mlx-spec generate` as real subprocesses on the tiny checkpoints."""

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

import serving
import tiny
from mlx_spec import load

STATS = re.compile(
    r"^\[(\d+) tokens, [\d.]+ tok/s, prompt (\d+) tokens \((\d+) processed at [\d.]+ tok/s, (\d+) reused\), (.*), peak memory .*\]$", re.M
)
ENV = dict(serving.ENV)


def command(checkpoints, *args):
    return [sys.executable, "-m", "mlx_spec.cli", *args[:1], "--model", str(checkpoints["text"]),
            "--drafter", str(checkpoints["assistant"]), *args[1:]]


def run(argv, stdin="", timeout=120):
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=ENV)


def answers_and_stats(stdout):
    """Split chat output into (answer text, stats groups) per turn."""
    turns, last = [], 0
    for m in STATS.finditer(stdout):
        turns.append((stdout[last : m.start()], m.groups()))
        last = m.end() + 1
    return turns


def test_chat_session_through_stdin(checkpoints):
    script = "\n".join(["Hello there", "Tell me more", "/stats", "/reset", "/mtp off", "Hello there", "/stats", "/quit", ""])
    out = run(command(checkpoints, "chat", "--max-tokens", "30"), script)
    assert out.returncode == 0, out.stderr
    turns = answers_and_stats(out.stdout)
    assert len(turns) == 3
    (first, s1), (second, s2), (third, s3) = turns
    assert "guesses kept" in s1[4] and s3[4] == "no drafting"
    # The second turn resumed the first: it reused the first prompt, all but its empty thought
    # channel (left out when the history is rendered).
    assert int(s1[3]) == 0 and int(s1[1]) - 12 < int(s2[3]) < int(s1[1])
    # The prompt's length, as a server's usage counts it: all but its last token went through
    # the target or were reused (found by a review: the line said 26 where usage said 27).
    assert all(int(s[1]) == int(s[2]) + int(s[3]) + 1 for s in (s1, s2, s3))
    # After /reset, the same question with MTP off gives the same greedy answer.
    assert third.startswith("[session: 2 turns") and third.endswith("[mtp off]\n" + first)
    assert len(first.strip()) > 0
    assert "[conversation cleared]" in out.stdout and "[mtp off]" in out.stdout
    assert re.search(r"\[session: 2 turns, \d+ tokens, guesses kept \d+/\d+, \d+ positions cached, mtp on, thinking off\]", out.stdout)
    assert re.search(r"\[session: 3 turns, .* mtp off, thinking off\]", out.stdout)


@pytest.fixture(scope="module")
def endless(checkpoints, tmp_path_factory):
    """The tiny checkpoints whose turns never end (no end-of-turn or tool-response stop token; the
    tokenizer's <eos> stays), so that an answer runs until it is stopped."""
    folder = tmp_path_factory.mktemp("endless") / "target"
    shutil.copytree(checkpoints["text"], folder)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text())
        config["eos_token_id"] = [10 * tiny.VOCAB]
        (folder / name).write_text(json.dumps(config))
    assert load(str(folder), drafter=None).stop_tokens == [tiny.EOS_ID, 10 * tiny.VOCAB]
    return {"text": folder, "assistant": checkpoints["assistant"]}


def long_answer_prompt(checkpoints):
    """A question the tiny model answers for more than LONG tokens (greedy, deterministic)."""
    engine = load(str(checkpoints["text"]), drafter=None)
    for question in ["What time is it?", "Hello there", "Tell me a story", "Why?", "Hi"]:
        result = engine.generate([{"role": "user", "content": question}], max_tokens=LONG, report=False)
        if result.finish_reason == "length":
            return question
    pytest.fail("no candidate question gives the tiny model a long answer")


LONG = 600  # tokens: far more than are printed before Ctrl-C lands


def test_ctrl_c_stops_the_answer_and_the_session_goes_on(endless):
    question = long_answer_prompt(endless)
    proc = subprocess.Popen(
        command(endless, "chat", "--max-tokens", str(LONG)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
    )
    try:
        proc.stdin.write(f"{question}\n".encode())
        proc.stdin.flush()
        output = read_until(proc, lambda b: len(b) > 40, timeout=120)
        proc.send_signal(signal.SIGINT)
        output += read_until(proc, lambda b: b"[stopped]" in b and STATS.search(b.decode(errors="replace")), timeout=60, seen=output)
        proc.stdin.write(b"Hi\n/quit\n")
        proc.stdin.flush()
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    turns = answers_and_stats((output + rest).decode())
    assert len(turns) == 2 and turns[0][0].endswith("\n[stopped]\n")
    interrupted = int(turns[0][1][0])
    assert 0 < interrupted < LONG
    # The next turn is answered as a session stopped at the same token answers it in-process.
    session = load(str(endless["text"]), str(endless["assistant"])).chat(max_tokens=LONG)
    assert len(list(session.send(question, max_tokens=interrupted))) == interrupted
    assert turns[1][0] == printed(session.send("Hi"))


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_generate_into_a_pipe_its_reader_closes_ends_quietly_with_status_0(endless, flags):
    """`mlx-spec generate ... | head`: Click ends a run whose standard output closed with status
    1, which a script under `set -o pipefail` reads as a failure. It did what it was asked until
    nobody read on: status 0, and no traceback."""
    proc = subprocess.Popen(command(endless, "generate", "--prompt", long_answer_prompt(endless), "--max-tokens",
                                    str(LONG), "--no-lookup", *flags),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout.read(8)  # what `head -c 8` reads
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""


def printed(reports) -> str:
    """What chat prints for these reports when piped (channel markers included)."""
    import contextlib
    import io

    from mlx_spec.cli.terminal import TokenPrinter

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        printer = TokenPrinter(show_probs=False, terminal=False)
        for report in reports:
            printer.print(report)
        printer.end()
    return out.getvalue()


def read_until(proc, done, timeout, seen=b""):
    data, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            data += chunk
            if done(seen + data):
                return data
    raise AssertionError(f"timed out; output so far: {(seen + data)[-500:]!r}")


def test_generate_json_lines(checkpoints):
    out = run(command(checkpoints, "generate", "--prompt", "Hello", "--max-tokens", "12", "--json", "--temp", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "3"))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert 1 <= len(tokens) <= 12
    for t in tokens:
        assert set(t) == {"token", "text", "raw", "channel", "prob", "rank", "sampling_prob", "candidates", "top", "drafted", "cycle"}
        assert len(t["top"]) == 5 and set(t["top"][0]) == {"id", "prob", "text"}
        assert 1 <= t["candidates"] <= 20
    assert set(summary) == {"stats", "text", "thinking", "finish_reason", "tool_calls", "group"}
    assert summary["group"] == {"size": 1, "rank": 0}  # a process alone (docs/distributed.md)
    assert summary["stats"]["generated_tokens"] == len(tokens)
    assert summary["stats"]["host_syncs"] == summary["stats"]["cycles"]


def test_thinking_in_generate_and_chat(trained, checkpoints):
    """The tiny target trained to think before it greets (tests/chat_script.py)."""
    from chat_script import GREETING, HELLO, THOUGHT

    model = ["--model", str(trained), "--drafter", str(checkpoints["assistant"])]
    out = run([sys.executable, "-m", "mlx_spec.cli", "generate", *model, "--thinking", "--json", "-p", GREETING])
    summary = json.loads(out.stdout.splitlines()[-1])
    assert (summary["thinking"], summary["text"], summary["finish_reason"]) == (THOUGHT, HELLO, "stop")
    out = run([sys.executable, "-m", "mlx_spec.cli", "chat", *model, "--thinking"], f"{GREETING}\n/thinking off\n/stats\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"[thinking]\n{THOUGHT}[/thinking]\n{HELLO}\n[")
    assert "[thinking off]" in out.stdout and "thinking off]" in out.stdout.splitlines()[-1]


def test_generate_reads_stdin_and_mtp_matches_no_mtp(checkpoints):
    a = run(command(checkpoints, "generate", "--max-tokens", "20"), "Hello there")
    b = run(command(checkpoints, "generate", "--max-tokens", "20", "--no-mtp"), "Hello there")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "guesses kept" in a.stderr and "no drafting" in b.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temp", "-1"], "temperature must be a finite number >= 0, got -1.0"),
        (["--top-p", "1.5"], r"top_p must be in \(0, 1\], got 1.5"),
        (["--top-k", "-3"], "top_k must be an integer >= 0"),
        (["--draft-tokens", "-2"], "draft_tokens must be between 0 and 16, got -2"),
        (["--draft-tokens", "40"], "draft_tokens must be between 0 and 16, got 40"),
        (["--seed", "-1"], r"seed must be an integer in \[0, 2\*\*64\), got -1"),
        (["--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        (["--bogus"], "No such option: --bogus|No such option '--bogus'"),
        (["--temp", "hot"], "'hot' is not a valid float"),
        (["--context", "-5"], r"Invalid value for '--context': -5 is not in the range x>=1"),  # (it ran: a review)
    ],
)
def test_bad_values_exit_with_one_line(checkpoints, args, message):
    out = run(command(checkpoints, "chat", *args), "")
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert re.search(message, out.stderr)


def bytes_run(argv, stdin: bytes, **env):
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120, env={**ENV, **env})


@pytest.mark.parametrize("locale", ["utf-8", "utf-8:strict"])
def test_input_that_is_not_utf8_is_read_as_replacement_characters(checkpoints, locale):
    """Bytes that are not UTF-8 were a traceback from deep inside (a surrogate the tokenizer or
    a group's line could not encode; with a strict locale, the read itself): found by a review.
    They are read as U+FFFD, the chat says so, and the session goes on."""
    bad = "hello \xff\xfe bad".encode("latin-1")
    chat = bytes_run(command(checkpoints, "chat", "-m", "4", "--no-mtp"), bad + b"\nsecond\n", PYTHONIOENCODING=locale)
    assert chat.returncode == 0 and not chat.stderr, chat.stderr
    out = chat.stdout.decode()
    assert out.count("[bytes that are not UTF-8 were read as \ufffd]") == 1 and len(STATS.findall(out)) == 2
    generate = bytes_run(command(checkpoints, "generate", "-m", "4", "--no-mtp", "--json"), bad, PYTHONIOENCODING=locale)
    assert generate.returncode == 0, generate.stderr
    engine = load(str(checkpoints["text"]), drafter=None)
    expected = engine.generate([{"role": "user", "content": [{"type": "text", "text": "hello \ufffd\ufffd bad"}]}],
                               max_tokens=4).tokens
    assert [json.loads(line)["token"] for line in generate.stdout.decode().splitlines()[:-1]] == expected


def test_mtp_on_without_an_assistant_says_what_drafts(checkpoints):
    """`/mtp on` after --no-mtp said "[mtp on]", and no turn drafted (found by a review)."""
    out = run(command(checkpoints, "chat", "-m", "3", "--no-mtp"), "/mtp on\n/mtp off\n")
    assert "[mtp on: prompt lookup only, no assistant was loaded]\n[mtp off]" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], r"Invalid value for '--port': 70000 is not in the range 0<=x<=65535"),
    (["--host", "999.1.1.1", "--port", "18081"], "cannot listen on 999.1.1.1:18081: "),
])
def test_serve_refuses_where_it_cannot_listen_before_it_loads(checkpoints, args, message):
    """Each was a traceback from uvicorn after the model had loaded, or an abort at teardown
    (found by a review)."""
    out = run(command(checkpoints, "serve", *args))
    assert out.returncode in (1, 2) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert re.search(message, out.stderr)


@pytest.mark.parametrize("value, message", [
    ("nan", "--cache-gb must be a number of GB >= 0, got nan"),  # (a traceback: a review)
    # (it served only 400s; then its message gave the memory left as "-99977.25 GB": a review)
    ("100000", r"the prompt cache \(100000 GB\) takes all the memory left beside the weights \([\d.]+ GB\): none is "
               r"left for the requests' K/V cache \(lower --cache-gb\)"),
])
def test_serve_refuses_a_prompt_cache_that_leaves_no_room(checkpoints, value, message):
    out = run(command(checkpoints, "serve", "--port", "0", "--cache-gb", value))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert re.search(message, out.stderr), out.stderr


def test_an_answer_past_the_context_says_how_much_fits(checkpoints):
    """"prompt too long" for a prompt of 27 tokens: the answer asked for was (found by a review)."""
    out = run(command(checkpoints, "generate", "-m", "4096", "-p", "hi"))
    assert out.returncode == 1 and re.fullmatch(
        r"mlx-spec: (\d+) prompt tokens plus 4096 to generate exceed the model's 4096 positions: at most \d+ can be "
        r"generated\n", out.stderr), out.stderr


def test_python_dash_m_mlx_spec_is_the_command():
    """`python -m mlx_spec` said "cannot be directly executed" (found by a review)."""
    out = run([sys.executable, "-m", "mlx_spec", "--help"])
    assert out.returncode == 0 and "chat" in out.stdout and "serve" in out.stdout, out.stderr


def test_messages_to_a_checkpoint_without_a_chat_template(no_template):
    model = [sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(no_template), "--no-mtp", "-m", "3"]
    out = run([*model, "--prompt", "Hello"])
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"mlx-spec: chat messages need a chat template, and the tokenizer of {no_template} has none")
    assert "--raw" in out.stderr
    out = run([*model, "--raw", "--prompt", "Hello"])
    assert out.returncode == 0, out.stderr


def test_missing_model_folder(tmp_path):
    out = run([sys.executable, "-m", "mlx_spec.cli", "chat", "--model", str(tmp_path / "none")], "")
    assert out.returncode == 1
    assert out.stderr.strip() == f"mlx-spec: target {tmp_path / 'none'}: no such folder"


def test_unknown_command(checkpoints):
    out = run(command(checkpoints, "chat", "--max-tokens", "3"), "/frobnicate\n/help\n/mtp maybe\n")
    assert out.returncode == 0
    assert "[unknown command '/frobnicate'; /help lists them]" in out.stdout
    assert "/reset (forget the conversation)" in out.stdout
    assert "[unknown command '/mtp maybe'" in out.stdout


def test_generate_stops_at_a_string(checkpoints):
    """--stop, checked on the text across token boundaries: the text before it is printed, and
    the same answer without --stop goes on past it."""
    base = [*command(checkpoints, "generate", "--raw", "--max-tokens", "40", "--json"), "--prompt", "Hello there"]
    full = json.loads(run(base).stdout.splitlines()[-1])["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3, full
    out = run([*base, "--stop", "never written", "--stop", stop])
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["text"] == full[: full.index(stop)] and summary["finish_reason"] == "stop"


def test_a_file_too_big_for_a_group_to_share_says_so(tmp_path):
    """Under a group rank 0 reads an --image or /image file and sends its bytes to every rank, up
    to 1 GiB. A file over that was refused as one rank 0 "cannot read"; the words now give both
    reasons, as only rank 0 knows which it was. (A sparse file: no disk is used.)"""
    from types import SimpleNamespace

    from mlx_spec.cli.app import read_by_rank_0
    from mlx_spec.cli.group import MAX_SHARED_BYTES
    from mlx_spec.errors import SettingsError

    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate(MAX_SHARED_BYTES + 1)
    rank_0 = SimpleNamespace(lockstep=SimpleNamespace(leader=True, data=lambda data: data))
    with pytest.raises(SettingsError, match=r"big.png: rank 0 of the group cannot read this file, or it is over 1 GiB"):
        read_by_rank_0(rank_0, str(big))


def test_a_bad_image_file_is_named_by_its_flag_and_path(multimodal, tmp_path):
    """An --image that is no image, or an /image in the chat, was named by its place in the
    message the command builds (messages[0].content[1]): with several files, which one? It is
    named as the user gave it."""
    good, bad = tmp_path / "good.png", tmp_path / "notes.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(good)
    bad.write_text("not an image")
    out = run(command(multimodal, "generate", "--image", str(good), "--image", str(bad), "-p", "What?"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(f"mlx-spec: --image {bad}: not an image Pillow can read"), out.stderr
    chat = run(command(multimodal, "chat", "--max-tokens", "4"), f"/image {bad}\nWhat is it?\n/quit\n")
    assert f"/image {bad}: not an image Pillow can read" in chat.stdout + chat.stderr, chat.stdout + chat.stderr
