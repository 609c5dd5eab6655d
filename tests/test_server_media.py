"""Images and audio through a real `mlx-spec serve` on the 12B's tiny multimodal checkpoint, with
the official `openai` client: an `image_url` data URL and an `input_audio` part give
`Engine.generate`'s answer over the same messages; a second request reuses the image (usage
says so); bad media get a clear 4xx and the server stays healthy; local files and URLs only
where the flags allow them."""

import base64
import http.server
import io
import threading

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

import tiny
from mlx_spec import load
from serving import Server
from test_media_prompt import clip, picture, wav_bytes

IMAGE_TOKENS = 70


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("server-media")
    return {"text": tiny.build_target(root / "target", layout="google", variant="12b"),
            "assistant": tiny.build_family_assistant(root / "assistant", "12b")}


@pytest.fixture(scope="module")
def server(pair):
    s = Server(pair, "--image-tokens", str(IMAGE_TOKENS), "--served-model-name", "12b")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engine(pair):
    return load(str(pair["text"]), str(pair["assistant"]))


def png_bytes(seed=0):
    out = io.BytesIO()
    Image.fromarray(picture(seed)).save(out, format="PNG")
    return out.getvalue()


def image_part(data: bytes):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def audio_part(data: bytes):
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


def ask(*parts, text="What is in this picture and this sound?"):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def test_an_image_and_a_clip_give_generate_s_answer(client, engine):
    messages = ask(image_part(png_bytes()), audio_part(wav_bytes(clip())))
    expected = engine.generate(messages, max_tokens=30, image_tokens=IMAGE_TOKENS)
    reply = client.chat.completions.create(model="12b", messages=messages, max_tokens=30, temperature=0,
                                           extra_body={"x_report": True})
    assert [t["token"] for t in reply.choices[0].x_tokens] == expected.tokens
    assert reply.choices[0].message.content == expected.text
    tokens, spans = engine.prepare(messages, image_tokens=IMAGE_TOKENS)
    assert reply.usage.prompt_tokens == len(tokens) and [s.item.kind for s in spans] == ["image", "audio"]
    assert reply.usage.x_media_tokens == sum(s.item.tokens for s in spans)


def test_the_next_request_reuses_the_image(client, engine):
    first = ask(image_part(png_bytes(seed=3)), text="Describe it.")
    reply = client.chat.completions.create(model="12b", messages=first, max_tokens=8)
    tokens, spans = engine.prepare(first, image_tokens=IMAGE_TOKENS)
    follow = first + [{"role": "assistant", "content": reply.choices[0].message.content},
                      {"role": "user", "content": "And the colours?"}]
    again = client.chat.completions.create(model="12b", messages=follow, max_tokens=8)
    assert again.usage.prompt_tokens_details.cached_tokens >= spans[0].end
    assert again.usage.x_media_tokens == 0
    other = ask(image_part(png_bytes(seed=4)), text="Describe it.")  # same text, another image
    third = client.chat.completions.create(model="12b", messages=other, max_tokens=8)
    assert third.usage.prompt_tokens_details.cached_tokens < spans[0].start
    assert third.usage.x_media_tokens == spans[0].item.tokens


@pytest.mark.parametrize("part, status, words", [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}, 400, "not an image"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,###"}}, 400, "not valid base64"),
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, 400, "--allow-fetch"),
    ({"type": "image_url", "image_url": {"url": "/etc/hostname"}}, 400, "--allow-files"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}, 400, "--allow-files"),
    ({"type": "image_url", "image_url": 7}, 400, "image_url must be"),
    ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, 400, "not a PCM WAV"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aac"}}, 400, "'aac'"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}, 400, "nor a format soundfile reads"),
    ({"type": "video_url", "video_url": {"url": "x"}}, 400, "parts must be of types"),
    # (these read "the chat template cannot render these messages: expected str, bytes or
    # os.PathLike object, not int": a review)
    ({"type": "image", "image": 5}, 400, "an image must be a path, encoded bytes, an array or a PIL image; got int"),
    ({"type": "audio", "audio": {"a": 1}}, 400, "audio must be a WAV file's path or bytes"),
])
def test_bad_media_get_a_clear_4xx_and_the_server_stays_healthy(server, client, part, status, words):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ask(part), "max_tokens": 4}, timeout=60)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    assert "0x" not in r.json()["error"]["message"]  # (a BytesIO object's address: a review)
    assert server.health()["running"] == 0
    assert client.chat.completions.create(model="12b", messages=ask(text="Hi"), max_tokens=3).choices


@pytest.mark.parametrize("image, place", [("data:image/png;base64,###", "not valid base64"),
                                          ("https://example.com/a.png", "--allow-fetch")])
def test_a_bad_image_in_an_agent_dialect_names_the_client_s_own_place(server, image, place):
    """Messages' system prompt and Responses' instructions become a chat message before the
    client's: a bad image in the client's messages[0] or input[1] was named messages[1] or
    messages[2], places the client never wrote (found by a review)."""
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image.split(",")[1]}
             if image.startswith("data:") else {"type": "url", "url": image}}
    claude = httpx.post(server.url + "/v1/messages", timeout=60, json={
        "model": "12b", "max_tokens": 4, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}, block]}]})
    assert claude.status_code == 400 and claude.json()["error"]["message"].startswith("messages[0].content[1]: "), claude.text
    assert place in claude.json()["error"]["message"]
    codex = httpx.post(server.url + "/v1/responses", timeout=60, json={
        "model": "12b", "max_output_tokens": 4, "instructions": "Be brief.", "input": [
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "input_text", "text": "What?"}, {"type": "input_image", "image_url": image}]}]})
    assert codex.status_code == 400 and codex.json()["error"]["message"].startswith("input[1].content[1]: "), codex.text
    assert place in codex.json()["error"]["message"]


def test_too_many_image_tokens_for_the_context_is_a_400(server):
    big = np.zeros((2000, 2000, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(big).save(out, format="PNG")
    parts = [image_part(out.getvalue())] * 20  # 20 x 1,120 soft tokens: past the tiny model's 4,096 positions
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                   json={"messages": ask(*parts), "max_tokens": 4, "image_tokens": 1120})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_files_and_urls_only_with_their_flags(pair, tmp_path):
    picture_file = tmp_path / "picture.png"
    picture_file.write_bytes(png_bytes())

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(picture_file.read_bytes())

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{site.server_address[1]}/picture.png"
    s = Server(pair, "--image-tokens", str(IMAGE_TOKENS), "--allow-files", "--allow-fetch", "--served-model-name", "12b")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
        answers = [client.chat.completions.create(model="12b", messages=ask({"type": "image_url", "image_url": {"url": u}}),
                                                  max_tokens=6, temperature=0).choices[0].message.content
                   for u in (str(picture_file), "file://" + str(picture_file), url)]
        inline = client.chat.completions.create(model="12b", messages=ask(image_part(png_bytes())), max_tokens=6,
                                                temperature=0).choices[0].message.content
        assert answers == [inline] * 3
    finally:
        s.stop()
        site.shutdown()


def test_an_image_a_tool_returns_is_seen_in_both_agent_dialects(server, engine):
    """Claude Code's Read and Codex's view_image return an image in the tool's result. It reaches
    the model after the tool's response (Google's template writes a response's text only), with
    the official anthropic and openai clients, as `Engine.generate` answers the same turn."""
    import anthropic

    data = base64.b64encode(png_bytes(seed=5)).decode()
    call = {"id": "t1", "type": "function", "function": {"name": "read", "arguments": {"path": "a.png"}}}
    chat = [{"role": "user", "content": "Open a.png"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "a.png"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}]}]
    expected = engine.generate(chat, max_tokens=12, image_tokens=IMAGE_TOKENS)
    tokens, spans = engine.prepare(chat, image_tokens=IMAGE_TOKENS)
    assert [s.item.kind for s in spans] == ["image"]

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    message = claude.messages.create(model="12b", max_tokens=12, messages=[  # the server greedy by default
        {"role": "user", "content": "Open a.png"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "a.png"}, image]}]}])
    assert "".join(b.text for b in message.content if b.type == "text") == expected.text
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(tokens)

    codex = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    response = codex.responses.create(model="12b", max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": "Open a.png"},
        {"type": "function_call", "call_id": "t1", "name": "read", "arguments": '{"path": "a.png"}'},
        {"type": "function_call_output", "call_id": "t1", "output": [
            {"type": "input_text", "text": "a.png"},
            {"type": "input_image", "image_url": "data:image/png;base64," + data}]}])
    assert response.output_text == expected.text and response.usage.input_tokens == len(tokens)


def test_a_url_that_answers_in_another_protocol_is_a_400():
    """With --allow-fetch, a reply that is not HTTP (an SSH banner) reached the client as a 500:
    http.client's own errors come through urllib unwrapped."""
    import socket

    from mlx_spec.server.media import fetch
    from mlx_spec.server.schemas import APIError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def banner():
        connection, _ = listener.accept()
        connection.recv(1024)
        connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        connection.close()

    threading.Thread(target=banner, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    try:
        with pytest.raises(APIError) as raised:
            fetch(url, "messages[0].content[0]", 1000)
    finally:
        listener.close()
    assert raised.value.status == 400 and "could not fetch" in raised.value.message and "SSH-2.0" in raised.value.message
