"""The page at `/` in a real headless chromium (Debian's, driven by Selenium through the system
chromedriver; nothing downloads a browser): it loads, sends a message, shows the tokens coloured,
and a token's figures on hover. `MLX_SPEC_SCREENSHOT=docs/page.png python -m pytest tests/test_page.py`
saves the README's screenshot."""

import os
import re
import shutil
from pathlib import Path

import pytest

from mlx_spec import load
from serving import ROOT, Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("no chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)",
                allow_module_level=True)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

QUESTION, LIMIT = "Hello there", 40


@pytest.fixture(scope="module")
def server(checkpoints):
    s = Server(checkpoints)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,760"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def send(browser, text):
    count = len(browser.find_elements(By.CSS_SELECTOR, ".stats"))
    browser.find_element(By.ID, "prompt").send_keys(text)
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 120).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".stats")) > count)
    return browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]


def test_the_page_chats_and_shows_each_tokens_figures(server, browser, checkpoints, tmp_path):
    expected = load(str(checkpoints["text"]), str(checkpoints["assistant"])).generate(
        [{"role": "user", "content": QUESTION}], max_tokens=LIMIT)
    browser.get(server.url + "/")
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "model").text)
    name = browser.find_element(By.ID, "model")
    assert name.get_attribute("title") == str(checkpoints["text"]) and name.text == "/".join(checkpoints["text"].parts[-2:])
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys(str(LIMIT))
    answer = send(browser, QUESTION)

    tokens = answer.find_elements(By.CSS_SELECTOR, ".body > .tok")
    shown = [s for s in expected.steps if s.text and s.channel == "answer"]
    assert [int(t.get_attribute("data-id")) for t in tokens] == [s.token for s in shown]
    assert "".join(t.get_attribute("textContent") for t in tokens) == expected.text
    # Coloured by probability: hue 120 * p (the tiny random model is unsure of everything: red).
    for t, s in zip(tokens, shown):
        hue = round(120 * s.prob)
        assert t.get_attribute("style") == browser.execute_script(
            "const d = document.createElement('span'); d.style.background = arguments[0]; return d.getAttribute('style');",
            f"hsl({hue}, 75%, 82%)")
        assert ("kept" in t.get_attribute("class").split()) == s.drafted
    stats = answer.find_element(By.CSS_SELECTOR, ".stats").text
    assert re.match(rf"{len(expected.tokens)} tokens, [\d.]+ tok/s, (guesses kept \d+/\d+|no drafting); prompt \d+ tokens", stats)

    # Hover: the token's probability, rank, sampling probability, candidates, kept guess and top 5.
    ActionChains(browser).move_to_element(tokens[0]).perform()
    details = browser.find_element(By.ID, "details")
    WebDriverWait(browser, 10).until(lambda b: details.is_displayed())
    text = details.text
    first = shown[0]
    for figure in ("probability", "rank", "sampling probability", "candidates left", "kept guess", "top 5"):
        assert figure in text
    assert f"{100 * first.prob:.2f} %" in text or f"{100 * first.prob:.1f} %" in text
    top = details.find_elements(By.CSS_SELECTOR, ".top5 tr")
    assert len(top) == 5
    assert [r.find_element(By.CSS_SELECTOR, ".piece").get_attribute("textContent") for r in top] == [t for _, _, t in first.top]
    screenshot = Path(os.environ.get("MLX_SPEC_SCREENSHOT") or tmp_path / "page.png")
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000

    # MTP off for the next message: the stats line says so; the conversation goes on.
    browser.find_element(By.ID, "mtp").click()
    second = send(browser, "Tell me more")
    assert "no drafting" in second.find_element(By.CSS_SELECTOR, ".stats").text
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2


def test_the_page_is_shipped_and_offline(server):
    """No CDN: every script and stylesheet the page loads comes from the package itself."""
    import httpx

    page = httpx.get(server.url + "/").text
    assets = [a for a in re.findall(r'(?:src|href)="([^"]+)"', page) if a != "data:,"]  # no favicon request
    assert assets and all(a.startswith("/static/") for a in assets)
    for asset in assets:
        assert httpx.get(server.url + asset).status_code == 200
        assert Path(ROOT / "mlx_spec/server/static" / asset.removeprefix("/static/")).is_file()
    assert "http" not in "".join((ROOT / "mlx_spec/server/static" / a.removeprefix("/static/")).read_text() for a in assets)


def test_the_page_shows_a_thought_and_tool_calls_as_calls(server, browser, checkpoints):
    """The tiny random model calls no tool, so the page is fed the server's own chunks for a
    generation that thinks, answers and calls a tool (built by `ChatFormat` from the tokens)."""
    import json

    from mlx_spec.generation import build_result
    from mlx_spec.decoding.stats import Stats
    from mlx_spec.decoding.reports import TokenReport
    from mlx_spec.server.generation import Done, Token
    from mlx_spec.server.chat_objects import ChatFormat

    engine = load(str(checkpoints["text"]), drafter=None)
    text = '<|channel>thought\nHmm.<channel|>Let me check.<|tool_call>call:get_time{city:<|"|>Taipei<|"|>}<tool_call|>'
    ids = engine.tokenizer.encode(text, add_special_tokens=False) + [engine.tokenizer.convert_tokens_to_ids("<|tool_response>")]
    steps = list(engine.text.with_text(TokenReport(t, drafted=i % 2 == 1, cycle=i, prob=0.9, rank=1, sampling_prob=1.0,
                                              candidates=1) for i, t in enumerate(ids)))
    result = build_result(engine, steps, Stats(generated_tokens=len(steps), drafted=4, kept=2, generation_seconds=1.0))
    form = ChatFormat("tiny", logprobs=False, top_logprobs=0, report=True)
    tokens = [Token(s, engine.text.token_text(s.token), s.token in engine.stop_tokens) for s in steps]
    chunks = [*form.first_chunks(), *filter(None, map(form.token_chunk, tokens)),
              *form.last_chunks(20, Done(result, result.finish_reason, result.text), include_usage=True)]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    browser.get(server.url + "/")
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "model").text)
    browser.execute_script("""
        const real = window.fetch, sse = arguments[0];
        window.sent = [];
        window.fetch = (url, options) => {
          if (!String(url).includes("/chat/completions")) return real(url, options);
          window.sent.push(JSON.parse(options.body));
          return Promise.resolve(new Response(sse, {headers: {"Content-Type": "text/event-stream"}}));
        };""", sse)
    answer = send(browser, "What time is it in Taipei?")
    assert answer.find_element(By.CSS_SELECTOR, ".thought").text == "Hmm."
    assert "".join(t.get_attribute("textContent") for t in answer.find_elements(By.CSS_SELECTOR, ".body > .tok")) == "Let me check."
    calls = [c.text for c in answer.find_elements(By.CSS_SELECTOR, ".call:not(.callraw)")]
    assert calls == ['tool call: get_time({"city": "Taipei"})']
    assert len(answer.find_elements(By.CSS_SELECTOR, ".tok.kept")) > 0
    assert "guesses kept 2/4" in answer.find_element(By.CSS_SELECTOR, ".stats").text
    send(browser, "Thanks")
    history = browser.execute_script("return window.sent")[1]["messages"]
    assert history[1]["content"] == "Let me check."
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"city": "Taipei"}'}
    assert "index" not in history[1]["tool_calls"][0]


def record_requests(browser):
    """Keep each chat request's body the page sends (window.sent), passing it on to the server."""
    browser.execute_script("""
        const real = window.fetch;
        window.sent = [];
        window.fetch = (url, options) => {
          if (String(url).includes("/chat/completions")) window.sent.push(JSON.parse(options.body));
          return real(url, options);
        };""")


def open_page(browser, server, max_tokens):
    browser.get(server.url + "/")
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "model").text)
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys(str(max_tokens))
    record_requests(browser)


def test_a_refused_message_is_shown_once_and_not_sent_again(server, browser, checkpoints, tmp_path):
    """An image sent to a text-only model is refused with a 400, which the page shows. It also
    kept the refused turn (and an empty answer) in the conversation and sent it with every later
    message, each refused the same way until "New chat" (found by a review)."""
    from test_server_media import png_bytes

    (tmp_path / "cat.png").write_bytes(png_bytes(1))
    open_page(browser, server, 8)
    browser.find_element(By.ID, "attach").send_keys(str(tmp_path / "cat.png"))
    browser.find_element(By.ID, "prompt").send_keys("What is this?")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant .error")
                                     and b.find_element(By.ID, "send").is_displayed())
    assert "image" in browser.find_element(By.CSS_SELECTOR, ".msg.assistant .error").text
    answer = send(browser, QUESTION)
    asked = [{"role": "user", "content": QUESTION}]
    assert browser.execute_script("return window.sent")[-1]["messages"] == asked
    expected = load(str(checkpoints["text"]), str(checkpoints["assistant"])).generate(asked, max_tokens=8)
    shown = [s.token for s in expected.steps if s.text and s.channel == "answer"]
    assert [int(t.get_attribute("data-id")) for t in answer.find_elements(By.CSS_SELECTOR, ".body > .tok")] == shown


def test_new_chat_during_an_answer_ends_it_and_starts_empty(server, browser):
    """"New chat" while an answer streams: the answer went on, on the server for nobody, and
    once it ended it was pushed into the new conversation, sent with its first message (found
    by a review). Now the answer is stopped (its client leaves: /health's dropped), and the
    new conversation holds only its own messages."""
    import time

    open_page(browser, server, 2000)  # (the tiny model's answer runs about 2,000 tokens)
    dropped = server.health()["dropped"]
    browser.find_element(By.ID, "prompt").send_keys("Tell me a long story.")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 60).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".tok")) >= 5)
    browser.find_element(By.ID, "reset").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_element(By.ID, "send").is_displayed())
    assert browser.execute_script("return messages") == []
    deadline = time.monotonic() + 60
    while server.health()["dropped"] == dropped and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.health()["dropped"] == dropped + 1
    limit = browser.find_element(By.ID, "max_tokens")
    limit.clear()
    limit.send_keys("8")
    send(browser, QUESTION)
    assert browser.execute_script("return window.sent")[-1]["messages"] == [{"role": "user", "content": QUESTION}]


def test_a_bidirectional_control_in_a_token_is_shown_not_obeyed(server, browser):
    """A token holding U+202E (right-to-left override) reversed every token after it on screen,
    each coloured box over other tokens' characters (found by a review). It is shown as its code
    point, and the tokens after it read as written."""
    open_page(browser, server, 8)
    text = browser.execute_script("""
        const answer = new Answer();
        ["The total is ", "\\u202e", "100", " dollars."].forEach((t, i) =>
          answer.add({token: i, text: t, prob: 0.5, channel: "answer"}, {content: t}));
        return Array.from(answer.body.querySelectorAll(".tok")).map((s) => s.textContent).join("");""")
    assert text == "The total is \u27e6U+202E\u27e7100 dollars."
