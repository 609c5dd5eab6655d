"""`mlx-spec serve` across a group: rank 0 takes the requests and runs the scheduler, the other
rank follows its decisions (server/agreement.py). Against a single-process server on the same
checkpoint, with the official clients, several requests at once; and a rank that dies while a
request streams.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import anthropic
import httpx
import numpy as np
import openai
import pytest
from serving import ENV, ROOT, Server, free_port, wait_healthy
from test_distributed import THREADS, free_ports, launcher
from test_media_prompt import clip, wav_bytes

from mlx_spec.media.items import MediaItem, MediaSpan, Prepared
from mlx_spec.options import Options
from mlx_spec.server.agreement import MAX_MEDIA_BYTES, Agreement
from mlx_spec.server.generation import as_request, from_request, generation, media_item

pytestmark = pytest.mark.skipif(shutil.which("mlx.launch") is None, reason="mlx.launch (installed with mlx) is missing")


class GroupServer:
    """`serve` on 2 ranks: started by mlx.launch, or by hand (`by_hand`: each rank with the
    environment mlx.launch gives it, so that rank 0 outlives a rank that dies)."""

    def __init__(self, checkpoints, by_hand: bool = False, extra=(), fault=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        start = [str(Path(__file__).with_name("faulty_rank.py")), fault] if fault else ["-m", "mlx_spec.cli"]
        command = [sys.executable, *start, "serve", "--model", str(checkpoints["text"]), "--drafter",
                   str(checkpoints["assistant"]), "--port", str(self.port), "--log-level", "warning", "--served-model-name", "target", *extra]
        folder = Path(os.environ.get("TMPDIR", "/tmp"))
        self.logs = [tempfile.TemporaryFile("w+") for _ in (0, 1)]  # gone when closed: nothing left in /tmp
        self.hostfile = None
        env = {**ENV, **THREADS}
        if by_hand:
            first = free_ports(2)
            self.hostfile = folder / f"mlx-spec-hosts-{first}.json"
            self.hostfile.write_text(json.dumps([[f"127.0.0.1:{first + r}"] for r in range(2)]))
            self.procs = [subprocess.Popen(command, cwd=ROOT, stdout=self.logs[r], stderr=subprocess.STDOUT,
                                           env={**env, "MLX_HOSTFILE": str(self.hostfile), "MLX_RANK": str(r)})
                          for r in range(2)]
        else:
            self.procs = [subprocess.Popen(launcher() + command, cwd=ROOT, stdout=self.logs[0], stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True)]
        wait_healthy(self.url, self.procs, self.output, timeout=180)

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=5.0)

    def output(self) -> str:
        text = ""
        for log in self.logs:
            log.flush()
            log.seek(0)
            text += log.read()[-3000:]
        return text

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                (os.killpg(proc.pid, signal.SIGTERM) if len(self.procs) == 1 else proc.terminate())
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.hostfile is not None:
            self.hostfile.unlink(missing_ok=True)


# Several at once, of different lengths and settings: greedy, seeded nucleus sampling, a stop
# string, MTP off, past the tiny window (12) in every answer but the one a stop string ends.
CHATS = [
    dict(content="the first of several questions " * 3, max_tokens=24),
    dict(content="a second, sampled " * 9, max_tokens=22, temperature=1.0, top_p=0.9, seed=7),
    dict(content="third, up to a stop string " * 12, max_tokens=20, stop=["e", "ab"]),
    dict(content="fourth, with the target alone " * 2, max_tokens=18, extra_body={"mtp": False}),
    dict(content="fifth, sampled at top-k " * 5, max_tokens=26, temperature=0.8, seed=3, extra_body={"top_k": 20}),
]


def chat_answer(url: str, request: dict, stream: bool):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    request = dict(request)
    content = request.pop("content")
    kwargs = dict(model="target", messages=[{"role": "user", "content": content}], logprobs=True, **request)
    if not stream:
        answer = client.chat.completions.create(**kwargs)
        return [t.token for t in answer.choices[0].logprobs.content], answer.choices[0].message.content
    tokens, text = [], ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            tokens += [t.token for t in chunk.choices[0].logprobs.content]
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return tokens, text


def other_dialects(url: str):
    """A raw completion with a stop string, and Anthropic's Messages API, answered whole."""
    completion = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120).completions.create(
        model="target", prompt="a raw prompt, " * 6, max_tokens=32, stop=["e"])
    message = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120).messages.create(
        model="target", max_tokens=24, messages=[{"role": "user", "content": "the messages dialect"}])
    return completion.choices[0].text, completion.choices[0].finish_reason, message.content[0].text


def leave_early(url: str, words: int) -> int:
    """A streamed chat whose client leaves after its third chunk (its prompt of `words` words
    goes in by chunks beside the others' steps); the chunks it saw."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "long " * words}],
                                            max_tokens=200, stream=True)
    seen = 0
    for seen, _ in enumerate(stream, 1):
        if seen == 3:
            break
    stream.close()
    return seen


def everything_at_once(url: str):
    with ThreadPoolExecutor(len(CHATS) + 3) as pool:
        leaving = [pool.submit(leave_early, url, words) for words in (600, 40)]
        chats = [pool.submit(chat_answer, url, request, i % 2 == 0) for i, request in enumerate(CHATS)]
        dialects = pool.submit(other_dialects, url)
        assert [f.result() for f in leaving] == [3, 3]
        return [f.result() for f in chats], dialects.result()


def test_serve_under_mlx_launch_answers_as_one_process_does(checkpoints):
    """`mlx.launch ... mlx-spec serve`: several requests at once (streamed and whole, greedy and
    seeded, two clients leaving early, one with a prompt of two chunks that the others step
    between), then the same again (their conversations now in the prompt cache): every answer
    is the single-process server's, token for token, and /health names the group."""
    group, single = GroupServer(checkpoints), Server(checkpoints, "--served-model-name", "target")
    try:
        health = group.health().json()
        assert health["status"] == "ok" and health["group"] == {"size": 2, "rank": 0}
        expected = [chat_answer(single.url, request, stream=False) for request in CHATS], other_dialects(single.url)
        for round in range(2):  # the second: every conversation resumed from the prompt cache
            assert everything_at_once(group.url) == expected, (round, group.output())
        # (a client that left early is counted once its row ends, at the step after it left)
        deadline = time.monotonic() + 30
        while (health := group.health().json())["served"] < 2 * (len(CHATS) + 4) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert health["served"] == 2 * (len(CHATS) + 4)
        assert health["prompt_cache"]["sequences"] > 0 and health["running"] == 0
    finally:
        group.stop()
        single.stop()


def test_a_rank_lost_while_serving_ends_its_requests_and_the_server_says_down(checkpoints):
    """Rank 1 killed while a request streams (the ranks started by hand: mlx.launch would end
    rank 0 as well): the stream ends with a 503 naming the lost rank, /health is a 503 "down",
    and a new request gets the same 503 at once."""
    group = GroupServer(checkpoints, by_hand=True)
    try:
        client = openai.OpenAI(base_url=group.url + "/v1", api_key="none", max_retries=0, timeout=120)
        stream = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=400, stream=True)
        began = time.monotonic()
        with pytest.raises(openai.APIError, match="the group of 2 lost a rank"):
            for seen, _ in enumerate(stream, 1):
                if seen == 3:
                    group.procs[1].kill()
        assert time.monotonic() - began < 60
        health = group.health()
        assert health.status_code == 503 and health.json()["status"] == "down"
        assert "lost a rank" in health.json()["down"]
        with pytest.raises(openai.InternalServerError, match="The server is down"):
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "still there?"}],
                                           max_tokens=4)
    finally:
        group.stop()


def test_rank_0_failing_alone_ends_the_group_instead_of_leaving_it_waiting(checkpoints):
    """Rank 0's step fails with an error of its own machine (memory ran out there alone): the
    request gets a 503 saying the group can no longer agree, and rank 0 then ends, so that rank 1,
    waiting for it in a collective it would never join, ends too (found by a review: both went
    on for ever, rank 0 answering 503s and rank 1 waiting). The ranks started by hand: nothing
    but rank 0's end can end rank 1."""
    group = GroupServer(checkpoints, by_hand=True, fault="0:step")
    try:
        client = openai.OpenAI(base_url=group.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.APIError, match="can no longer agree"):
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        for proc in group.procs:
            proc.wait(60)
        assert [proc.returncode for proc in group.procs] == [1, 1], group.output()
        assert "rank 0 ends, so that the other ranks" in group.output()  # (its log keeps the traceback: unexpected)
    finally:
        group.stop()


def test_a_rank_lost_while_the_server_waits_turns_it_down_within_seconds(checkpoints):
    """Rank 1 killed while no request runs: rank 0's heartbeat (every 5 s while it waits) finds
    the lost rank, and /health says down before any request comes."""
    group = GroupServer(checkpoints, by_hand=True)
    try:
        group.procs[1].kill()
        deadline = time.monotonic() + 30
        while group.health().status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        health = group.health()
        assert health.status_code == 503 and "lost a rank" in health.json()["down"], group.output()
    finally:
        group.stop()


def test_a_request_travels_to_the_other_ranks_as_data(checkpoints):
    """The request rank 0 admits reaches the others as JSON, from which they make a job of the
    same settings and positions, its media the very arrays the encoder reads; a request that
    cannot be sent (a drafter object, only the Python API makes one), or whose media would not
    fit one message, is refused by a group, by name."""
    options = Options(max_tokens=9, temperature=0.7, top_k=5, top_p=0.8, seed=4, draft_tokens=2, stop=("x", "yz"),
                      fit_context=True)
    pixels = np.random.default_rng(0).random((1, 3, 4, 5)).astype(np.float32)
    item = MediaItem.of("image", 3, pixels, np.arange(6, dtype=np.int64))
    request = as_request(Prepared([2, 5, 7, 7, 7, 9], [MediaSpan(2, item, lambda: None)]), options, None, True)
    again = json.loads(json.dumps(request))
    assert again == request and Options(**again["options"]) == options and again["as_written"] is True
    assert from_request(again).positions == 6 + 9
    rebuilt = media_item(again["media"][0])
    assert rebuilt == item and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(rebuilt.arrays, item.arrays))
    assert again["media"][0]["start"] == 2

    class Job:
        work = generation([2, 5], Options(drafter=object()))

    class Group:
        size = 2

    assert as_request([2, 5], Options(drafter=object()), None, False) is None and not Job.work.sendable
    refusal = Agreement(Group()).refusal(Job())
    assert refusal.status == 400 and "cannot be sent to the other ranks" in refusal.message
    assert Agreement(type("Alone", (), {"size": 1})()).refusal(Job()) is None
    # Media beyond what one message carries are refused by their size, before any is converted.
    big = Prepared([2, 5, 7], [MediaSpan(1, MediaItem("image", 1, "d", (np.zeros(MAX_MEDIA_BYTES // 4 + 1, np.float32),)),
                                         lambda: None)])
    Job.work = generation(big, options)
    refusal = Agreement(Group()).refusal(Job())
    assert refusal.status == 413 and "at most 512 MB" in refusal.message


def test_serve_under_mlx_launch_answers_images_and_audio_as_one_process_does(multimodal):
    """An image and a clip in a chat request to a group's server (the 12B's tiny multimodal
    checkpoint): rank 0 sends the encoder's arrays, every rank embeds them, and the answer is
    the single process's; the same image again resumes from the prompt cache on every rank."""
    from mlx_spec import load
    from test_server_media import IMAGE_TOKENS, ask, audio_part, image_part, png_bytes

    messages = ask(image_part(png_bytes(seed=5)), audio_part(wav_bytes(clip(seed=2))))
    engine = load(str(multimodal["text"]), str(multimodal["assistant"]))
    expected = engine.generate(messages, max_tokens=24, image_tokens=IMAGE_TOKENS).tokens
    group = GroupServer(multimodal, extra=["--image-tokens", str(IMAGE_TOKENS)])
    try:
        client = openai.OpenAI(base_url=group.url + "/v1", api_key="none", max_retries=0, timeout=120)
        for _ in range(2):
            reply = client.chat.completions.create(model="target", messages=messages, max_tokens=24, logprobs=True)
            assert [t.token for t in reply.choices[0].logprobs.content] == [engine.text.token_text(t) for t in expected]
        assert reply.usage.prompt_tokens_details.cached_tokens > 0
    finally:
        group.stop()


def children(pid: int) -> list:
    """The ids of the processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def test_ranks_end_when_the_launcher_is_killed(checkpoints):
    """`kill` of mlx.launch alone (a supervisor, `timeout`): mlx.launch forwards no SIGTERM, and
    both ranks went on, rank 0 still answering on its port (found by a review). Each rank now
    ends once its launcher has."""
    group = GroupServer(checkpoints)
    launcher_pid = group.procs[0].pid
    ranks = children(launcher_pid)
    try:
        assert len(ranks) == 2, ranks
        os.kill(launcher_pid, signal.SIGTERM)
        group.procs[0].wait(30)
        deadline = time.monotonic() + 60
        while any(map(running, ranks)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(map(running, ranks)), group.output()
        with pytest.raises(httpx.ConnectError):
            group.health()
    finally:
        group.stop()
        for pid in filter(running, ranks):  # (nothing of this test's left behind if it failed)
            os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether the process is there and not ended (a zombie has ended: its adopter reaps it)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_an_idle_follower_sleeps_between_heartbeats_and_a_busy_one_never(monkeypatch):
    """An idle follower waited for rank 0's next heartbeat inside the collective, where MLX's ring
    backend spins: a core busy on every follower of an idle server (measured: 12.9 CPU-s in
    20 s; 3.0 now, docs/distributed.md). After a point with no news and no job of its own, it
    sleeps through most of the next heartbeat's wait; with news or a job running, it never does."""
    import mlx_spec.server.agreement as agreement
    from mlx_spec.server.agreement import HEARTBEAT

    slept = []
    monkeypatch.setattr(agreement.time, "sleep", slept.append)
    assert 0 < agreement.IDLE_SLEEP < HEARTBEAT
    for news, tasks, sleeps in ((None, [], 1), ({"add": 0, "cancel": [3]}, [], 0), (None, [SimpleNamespace(info={"number": 0})], 0)):
        follower = SimpleNamespace(engine=SimpleNamespace(lockstep=SimpleNamespace(message=lambda: news)),
                                   together=SimpleNamespace(tasks=tasks), stopped={}, admitted=0)
        slept.clear()
        agreement.Follower._agree(follower)
        assert slept == [agreement.IDLE_SLEEP] * sleeps, (news, tasks)
