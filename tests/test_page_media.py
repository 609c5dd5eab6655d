"""Attaching an image and a clip (WAV, then FLAC) on the page, in a real headless chromium,
against a real `mlx-spec serve` on the 12B's tiny multimodal checkpoint: the files go through the
page's own file input (as a picker, paste or drop hands them over), show as a thumbnail and a
clip in the conversation, and the answer is `Engine.generate`'s over the same files."""

import base64

import pytest
from selenium.webdriver.common.by import By

import test_page
import test_server_media
from mlx_spec import load
from test_media_preprocessing import flac_bytes
from test_media_prompt import clip, wav_bytes
from test_server_media import IMAGE_TOKENS, png_bytes

browser, send = test_page.browser, test_page.send  # the browser fixture skips without chromium
pair, server = test_server_media.pair, test_server_media.server  # the 12B's tiny pair, served
LIMIT, QUESTION = 24, "What is in this picture and this sound?"


@pytest.mark.parametrize("audio_format", ["wav", "flac"])
def test_an_attached_image_and_clip_give_generate_s_answer(server, browser, pair, tmp_path, audio_format):
    image, audio = png_bytes(3), {"wav": wav_bytes, "flac": flac_bytes}[audio_format](clip())
    clip_name = f"purr.{audio_format}"
    (tmp_path / "cat.png").write_bytes(image)
    (tmp_path / clip_name).write_bytes(audio)
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": audio_format}},
        {"type": "text", "text": QUESTION}]}]
    engine = load(str(pair["text"]), str(pair["assistant"]))
    expected = engine.generate(messages, max_tokens=LIMIT, image_tokens=IMAGE_TOKENS)
    tokens, spans = engine.prepare(messages, image_tokens=IMAGE_TOKENS)

    browser.get(server.url + "/")
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys(str(LIMIT))
    browser.find_element(By.ID, "attach").send_keys(f"{tmp_path / 'cat.png'}\n{tmp_path / clip_name}")
    strip = browser.find_element(By.ID, "attachments")
    assert len(strip.find_elements(By.CSS_SELECTOR, ".attachment")) == 2
    answer = send(browser, QUESTION)

    asked = browser.find_elements(By.CSS_SELECTOR, ".msg.user")[-1]
    assert [i.get_attribute("alt") for i in asked.find_elements(By.CSS_SELECTOR, "img.thumb")] == ["cat.png"]
    assert clip_name in asked.find_element(By.CSS_SELECTOR, ".clip").text
    assert not strip.is_displayed()  # sent attachments leave the composer
    words = answer.find_elements(By.CSS_SELECTOR, ".body > .tok")
    shown = [s for s in expected.steps if s.text and s.channel == "answer"]
    assert [int(w.get_attribute("data-id")) for w in words] == [s.token for s in shown]
    stats = answer.find_element(By.CSS_SELECTOR, ".stats").text
    media = sum(s.item.tokens for s in spans)
    assert f"prompt {len(tokens)} tokens" in stats and f"{media} of them image and audio)" in stats


def test_a_file_the_page_cannot_send_is_left_out(server, browser, tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    browser.get(server.url + "/")
    browser.find_element(By.ID, "attach").send_keys(str(tmp_path / "notes.txt"))
    assert not browser.find_element(By.ID, "attachments").is_displayed()
