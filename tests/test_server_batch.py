"""The server decodes requests together: sent at once with the official `openai` client, each
answer is its solo one; /health shows the rows; `--max-batch` bounds them, the rest queue in
order; a request whose K/V could never fit is refused with a 400."""

import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from serving import ENV, Server

openai = pytest.importorskip("openai", reason="the openai client is in the test extra: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def server(checkpoints):
    s = Server(checkpoints, "--max-batch", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine(checkpoints):
    """The same checkpoints in-process, stop tokens included, as the server loads them."""
    from mlx_spec import load

    return load(str(checkpoints["text"]), str(checkpoints["assistant"]))


def ids(tokens):
    return [t["token"] for t in tokens]


def ask(text):
    return [{"role": "user", "content": text}]


QUESTIONS = [
    ("What time is it in Taipei?", dict(max_tokens=70)),
    ("Tell me about the lazy dog and the quick brown fox, at length.", dict(max_tokens=90, temperature=0.8, seed=3)),
    ("Hi", dict(max_tokens=20, extra_body={"mtp": False})),
    ("def add(a, b):", dict(max_tokens=60, temperature=1.0, top_p=0.9, seed=9)),
    ("Speculative decoding drafts tokens.", dict(max_tokens=40, extra_body={"draft_tokens": 3})),
    ("The weather is sunny today.", dict(max_tokens=50)),
]


def test_requests_sent_at_once_are_each_their_solo_answer(server, engine):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    answers, seen = {}, []

    def send(i, text, settings):
        extra = dict(settings.pop("extra_body", {}), x_report=True)
        answers[i] = client.chat.completions.create(model=model, messages=ask(text), extra_body=extra, **settings)

    threads = [threading.Thread(target=send, args=(i, q, dict(s))) for i, (q, s) in enumerate(QUESTIONS)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.append(server.health())
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert max(h["batch"]["rows"] for h in seen) >= 2  # decoding together, as /health shows
    assert max(h["running"] for h in seen) <= 4 and any(h["waiting"] for h in seen)  # six for four rows
    assert any(h["batch"]["tokens_per_second"] > 0 for h in seen)
    for i, (text, settings) in enumerate(QUESTIONS):
        settings = dict(settings)
        options = dict(settings.pop("extra_body", {}), **{k: v for k, v in settings.items()})
        assert ids(answers[i].choices[0].x_tokens) == engine.generate(ask(text), **options).tokens, text


def test_streams_that_end_together_are_not_counted_dropped(server):
    """Streamed answers read to their end, in rows of one batch: /health counts them served,
    none dropped (a finished stream used to cancel its job before the worker saw it end)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    server.wait_idle(timeout=60)
    before, texts = server.health(), {}

    def read(i, max_tokens):
        stream = client.chat.completions.create(model=model, messages=ask(f"Story {i}"), max_tokens=max_tokens,
                                                stream=True, extra_body={"mtp": i % 2 == 0})
        texts[i] = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    threads = [threading.Thread(target=read, args=(i, 20 + 25 * i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    server.wait_idle(timeout=30)
    after = server.health()
    assert len(texts) == 3 and all(texts.values())
    assert after["served"] == before["served"] + 3 and after["dropped"] == before["dropped"], (before, after)


def test_a_request_that_could_never_fit_is_refused_by_name(checkpoints):
    """A server whose memory leaves room for the K/V of a few hundred positions only."""
    from mlx_spec import load
    from mlx_spec.options import Options
    from mlx_spec.server import Worker, create_app
    from mlx_spec.server.admission import KVRoom

    worker = Worker(lambda: load(str(checkpoints["text"]), str(checkpoints["assistant"])), 0, max_batch=2,
                    kv_budget=1)
    per_position = KVRoom.for_engine(worker.engine, 0, 1).bytes_at(1000) / 1000
    worker.room.budget = int(per_position * 600)  # about 600 positions of K/V
    try:
        with TestClient(create_app(worker, "tiny", Options(max_tokens=8))) as http:
            refused = http.post("/v1/chat/completions", json=dict(model="tiny", messages=ask("Hi"), max_tokens=3000))
            assert refused.status_code == 400
            message = refused.json()["error"]["message"]
            # A tiny model's K/V is a few MB: in GB it read "0.00 GB" for both sizes (found by a review).
            assert "K/V cache" in message and "0.00 GB" not in message and " MB" in message, message
            fits = http.post("/v1/chat/completions", json=dict(model="tiny", messages=ask("Hi"), max_tokens=8))
            assert fits.status_code == 200
            health = http.get("/health").json()  # the refused request is no served one
            assert (health["served"], health["refused"]) == (1, 1), health
            # Messages and Responses take their max_tokens as a ceiling (Claude Code asks for
            # 128,000 whatever the model): it was refused the same way (found by a review). The
            # answer stops where memory ends, as where the context ends.
            cut = http.post("/v1/messages", json=dict(model="tiny", messages=ask("Tell me a long story."),
                                                      max_tokens=3000, x_report=True))
            assert cut.status_code == 200, cut.text
            body = cut.json()
            usage = body["usage"]
            positions = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["output_tokens"]
            assert body["stop_reason"] == "max_tokens" and positions == worker.room.most_alone(4096), usage
            here = load(str(checkpoints["text"]), str(checkpoints["assistant"]))  # (the worker's is its thread's)
            alone = here.generate(ask("Tell me a long story."), max_tokens=usage["output_tokens"])
            assert [t["token"] for t in body["x_tokens"]] == alone.tokens
            responses = http.post("/v1/responses", json=dict(model="tiny", input="Tell me a long story.",
                                                             max_output_tokens=3000))
            assert responses.status_code == 200 and responses.json()["status"] == "incomplete", responses.text
    finally:
        worker.close()


@pytest.fixture(scope="module")
def one_row(checkpoints):
    s = Server(checkpoints, "--max-batch", "1")
    yield s
    s.stop()


def test_an_answer_is_counted_served_as_it_is_handed_over(checkpoints):
    """/health read the moment a client has its whole answer counts it served and no longer
    running, though the job's task ends a turn later (a turn may be another prompt's chunk). It
    was counted only at the task's end, and a CI run read /health between the two."""
    import asyncio

    from mlx_spec import load
    from mlx_spec.server import Worker
    from mlx_spec.server.generation import Done, Started

    def work(engine, cache, stop, batch):
        yield Started(1)
        yield Done(None, "stop", "")
        time.sleep(0.5)  # the rest of its turn

    async def status_at_answer():
        async for event in worker.submit(work):
            if isinstance(event, Done):
                return worker.status()

    worker = Worker(lambda: load(str(checkpoints["text"]), str(checkpoints["assistant"])), 0, max_batch=2)
    try:
        at_answer = asyncio.run(status_at_answer())
        assert (at_answer["served"], at_answer["running"], at_answer["dropped"]) == (1, 0, 0), at_answer
        deadline = time.monotonic() + 10
        while worker.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (worker.status()["served"], worker.running) == (1, []), worker.status()  # counted once
    finally:
        worker.close()


def test_max_batch_one_answers_in_order(one_row, engine):
    client = openai.OpenAI(base_url=one_row.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    long = client.chat.completions.create(model=model, messages=ask("What time is it?"), max_tokens=3000,
                                          stream=True, extra_body={"mtp": False})
    chunks = iter(long)
    next(chunks)
    queued = {}
    thread = threading.Thread(target=lambda: queued.update(r=client.chat.completions.create(
        model=model, messages=ask("Hi"), max_tokens=8, extra_body={"x_report": True})))
    thread.start()
    health, deadline = one_row.health(), time.monotonic() + 60
    while health["waiting"] != 1 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
        health = one_row.health()
    assert health["running"] == 1 and health["waiting"] == 1 and health["max_batch"] == 1
    long.close()
    thread.join(60)
    assert ids(queued["r"].choices[0].x_tokens) == engine.generate(ask("Hi"), max_tokens=8).tokens


def test_a_stream_left_while_it_waits_in_pings_gives_its_place_up(one_row):
    """Anthropic's streams open, then ping, while the prompt waits (Claude Code's long prompts):
    a client that leaves then (Esc) ends its request at once. It leaves the line while the
    answer ahead of it still runs, rather than take the row at that answer's end and decode its
    budget for nobody. /health counts it dropped (the answer read to its end is not), and an
    idle batch decodes 0 tokens a second."""
    client = openai.OpenAI(base_url=one_row.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    one_row.wait_idle(timeout=60)
    before, ended = one_row.health(), {}
    # 2,128 tokens before the tiny model's end of turn, about 11 s on this project's CPU
    ahead = client.chat.completions.create(model=model, messages=ask("Tell me a long story."), max_tokens=4000,
                                           stream=True, extra_body={"mtp": False})
    chunks = iter(ahead)
    next(chunks)
    reader = threading.Thread(target=lambda: ended.update(reason=[c.choices[0].finish_reason for c in chunks if c.choices][-1]))
    reader.start()
    body = {"model": model, "max_tokens": 2000, "stream": True, "messages": ask("Hi")}
    with httpx.stream("POST", one_row.url + "/v1/messages", json=body, timeout=60) as waiting:
        events = (line for line in waiting.iter_lines() if line.startswith("event:"))
        # Anthropic's flow begins with message_start, pings after it (they came first: a review)
        assert [next(events), next(events)] == ["event: message_start", "event: ping"]
        assert one_row.health()["waiting"] == 1 and not ended
    deadline, health = time.monotonic() + 20, one_row.health()
    while health["waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
        health = one_row.health()
    assert health["waiting"] == 0 and not ended, (health, ended)  # it left while the answer ahead ran
    reader.join(120)
    assert ended == {"reason": "stop"}
    one_row.wait_idle(timeout=20)
    after = one_row.health()
    assert after["served"] == before["served"] + 2 and after["dropped"] == before["dropped"] + 1, after
    assert after["batch"]["rows"] == 0 and after["batch"]["tokens_per_second"] == 0.0, after


def test_bad_max_batch_is_refused(checkpoints):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "serve", "--model", str(checkpoints["text"]),
                          "--max-batch", "0"], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode != 0 and "--max-batch must be at least 1" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr
    httpx  # (imported for the module's clients)
