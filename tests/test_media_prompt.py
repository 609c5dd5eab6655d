"""Images and audio in the prompt, on the 12B's tiny multimodal checkpoint (google's layout, with
its encoder-free embedders), against transformers' `Gemma4UnifiedForConditionalGeneration`:
the prompt's logits, greedy generation with MTP on and off past the sliding window, sampling's
distribution, the caches' media identity, and the content parts.

The reference's attention over an image: Gemma 4's rule, as transformers' own
`create_masks_for_vision_model` builds it (sliding layers: an image's tokens see each other
both ways, within the window's lower bound; full layers causal). transformers' generate uses it
with a static cache; its dynamic-cache path builds Gemma 3's masks instead for this class (both
ways on every layer, past the window), an inconsistency of transformers 5.24 that we do not
follow (its Gemma 4 function says full layers stay causal on purpose).
"""

import base64
import io
import wave

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from test_media_preprocessing import flac_bytes
from mlx_spec import load
from mlx_spec.decoding.sequence import SequenceState
from mlx_spec.errors import MediaError
from mlx_spec.media.items import MediaSpan
from mlx_spec.models.gemma4.media_prefill import hidden_with_media
from mlx_spec.decoding.prompt_cache import PromptCache
from mlx_spec.sampling.settings import SamplingSettings
from mlx_spec.sampling.distribution import distribution
from scripted import ScriptedDrafter
from test_sampling import ALPHA, chi_square_p, fork
from kv import fresh_cache

IMAGE_TOKENS = 70  # with 4-pixel patches merged 2 x 2: about 64 soft tokens, five windows of 12
TOKEN = dict(image=tiny.MEDIA_IDS["<|image|>"], audio=tiny.MEDIA_IDS["<|audio|>"])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("media-12b")
    target = tiny.build_target(root / "target", layout="google", variant="12b")
    assistant = tiny.build_family_assistant(root / "assistant", "12b")
    return target, assistant


@pytest.fixture(scope="module")
def engine(pair):
    return load(str(pair[0]), str(pair[1]), force=True)


@pytest.fixture(scope="module")
def reference(pair):
    from transformers import Gemma4UnifiedForConditionalGeneration

    return Gemma4UnifiedForConditionalGeneration.from_pretrained(pair[0], dtype=torch.float32).eval()


def picture(seed=0, shape=(40, 56)):
    return (np.random.default_rng(seed).random((*shape, 3)) * 255).astype(np.uint8)


def clip(seed=0, samples=700):
    return (np.random.default_rng(seed).standard_normal(samples) * 0.1).astype(np.float32)


def wav_bytes(samples):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16_000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def messages(*media, text="What is this? Tell me."):
    return [{"role": "user", "content": [{"type": "text", "text": "Look:"}, *media, {"type": "text", "text": text}]}]


IMAGE = {"type": "image", "image": picture()}
AUDIO = {"type": "audio", "audio": clip()}
CASES = {"image": [IMAGE], "audio": [AUDIO], "both": [IMAGE, AUDIO]}


def transformers_inputs(tokens, spans):
    """What transformers' processor gives for these items: merged patches padded to the budget
    with (-1, -1) positions, audio frames with their mask, and the token types."""
    ids = torch.tensor([tokens])
    kwargs = {"mm_token_type_ids": ((ids == TOKEN["image"]) * 1 + (ids == TOKEN["audio"]) * 3)}
    for span in spans:
        if span.item.kind == "image":
            patches, positions = span.item.arrays
            pixels = torch.zeros(1, IMAGE_TOKENS, patches.shape[1])
            where = torch.full((1, IMAGE_TOKENS, 2), -1, dtype=torch.long)
            pixels[0, : len(patches)], where[0, : len(positions)] = torch.tensor(patches), torch.tensor(positions)
            kwargs.update(pixel_values=pixels, image_position_ids=where)
        else:
            frames = torch.tensor(span.item.arrays[0])[None]
            kwargs.update(input_features=frames, input_features_mask=torch.ones(frames.shape[:2], dtype=torch.bool))
    return ids, kwargs


def gemma4_masks(model, ids, mm_token_type_ids):
    return model.create_masks_for_generate(
        config=model.config, inputs_embeds=torch.empty((1, ids.shape[1], 0)), attention_mask=torch.ones_like(ids),
        cache=None, position_ids=torch.arange(ids.shape[1])[None], mm_token_type_ids=mm_token_type_ids,
        is_first_iteration=True)


def our_prompt_logits(engine, tokens, spans):
    cache = fresh_cache(engine.target)
    return np.array(engine.target.logits(hidden_with_media(engine.target, mx.array([tokens]), cache, spans, 0))[0])


@pytest.mark.parametrize("case", CASES)
def test_prompt_logits_match_transformers(engine, reference, pair, case):
    """Every position's logits, against transformers in float64: no further from it than three
    times transformers' own float32 (this random checkpoint's activations are large enough that
    float32 alone moves its logits by about 2e-4)."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    tokens, spans = engine.prepare(messages(*CASES[case]), image_tokens=IMAGE_TOKENS)
    assert [s.item.kind for s in spans] == [p["type"] for p in CASES[case]]
    ids, kwargs = transformers_inputs(tokens, spans)
    masks = gemma4_masks(reference, ids, kwargs.pop("mm_token_type_ids"))
    precise = Gemma4UnifiedForConditionalGeneration.from_pretrained(pair[0], dtype=torch.float64).eval()
    with torch.no_grad():
        expected = precise(input_ids=ids, attention_mask=masks, **{
            k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}).logits[0].numpy()
        float32 = reference(input_ids=ids, attention_mask=masks, **kwargs).logits[0].numpy()
    ours = our_prompt_logits(engine, tokens, spans)
    own_error = np.abs(float32 - expected).max()
    assert np.abs(ours - expected).max() <= 3 * own_error + 1e-5


def test_an_image_attends_both_ways_only_where_the_config_asks(engine):
    """Changing the image's last patch moves the logits at its first soft token when its tokens
    attend both ways (the 12B's config), and leaves every earlier position alone when they do
    not: causal attention is the default, and audio is always causal."""
    a, spans_a = engine.prepare(messages(IMAGE), image_tokens=IMAGE_TOKENS)
    span = spans_a[0]
    features = span.embed()
    changed = mx.concatenate([features[:-1], -features[-1:]])  # the image's last soft token only
    spans_b = [MediaSpan(span.start, span.item, lambda: changed)]
    start, end = span.start, span.end
    both_ways = [our_prompt_logits(engine, a, s) for s in (spans_a, spans_b)]
    assert np.abs(both_ways[0][start] - both_ways[1][start]).max() > 1e-3
    engine.target.images_attend_both_ways = False
    try:
        causal = [our_prompt_logits(engine, a, s) for s in (spans_a, spans_b)]
    finally:
        engine.target.images_attend_both_ways = True
    assert np.abs(causal[0][: end - 1] - causal[1][: end - 1]).max() == 0
    assert np.abs(causal[0][end - 1] - causal[1][end - 1]).max() > 1e-3


@pytest.mark.parametrize("case", CASES)
def test_greedy_with_media_is_the_targets_past_the_window(engine, reference, case):
    """(The sliding window is 12; the image alone spans five windows.)"""
    assert_greedy_is_the_targets(engine, reference, messages(*CASES[case]), transformers_inputs)


def assert_greedy_is_the_targets(engine, reference, prompt, inputs_for_transformers):
    """Greedy: MTP off, MTP on (the tiny assistant, 1, 3 and 6 guesses, and scripted guesses
    with all, none and each number kept) and transformers' generate give the same 40 tokens."""
    tokens, spans = engine.prepare(prompt, image_tokens=IMAGE_TOKENS)
    ids, kwargs = inputs_for_transformers(tokens, spans)
    expected = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                                  do_sample=False, cache_implementation="static", **kwargs)[0, len(tokens):].tolist()
    off = engine.generate(prompt, max_tokens=40, mtp=False, image_tokens=IMAGE_TOKENS)
    assert off.tokens == expected[: len(off.tokens)] and len(off.tokens) > tiny.WINDOW
    for g in (1, 3, 6):
        assert engine.generate(prompt, max_tokens=40, draft_tokens=g, image_tokens=IMAGE_TOKENS).tokens == off.tokens
    for break_at in (None, 0, 1, 2, 3, 4, 5):
        drafter = ScriptedDrafter(tokens + off.tokens, tiny.VOCAB, break_at=break_at)
        got = engine.generate(prompt, max_tokens=40, drafter=drafter, draft_tokens=6, image_tokens=IMAGE_TOKENS)
        assert got.tokens == off.tokens
        if break_at is None:
            assert got.stats.kept >= len(off.tokens) - 2 * got.stats.cycles  # nearly every guess kept
        else:
            assert got.stats.kept <= break_at * got.stats.cycles


def test_sampling_with_an_image_follows_the_target(engine):
    """1,000 seeded generations of two tokens after a prompt with an image, with the tiny
    assistant's sampled guesses: the first and second tokens follow the target's own
    distributions (chi-square at ALPHA)."""
    s = SamplingSettings(temperature=1.0, top_k=64, top_p=0.95)
    tokens, spans = engine.prepare(messages(IMAGE), image_tokens=IMAGE_TOKENS)
    base = SequenceState(engine.target)
    engine.decoder(mtp=False).start(base, tokens, spans)
    last = tokens[-1]
    state = fork(base)
    logits = engine.target(mx.array([[last]]), state.cache)[0][0, -1]
    p0 = np.array(distribution(logits, s).dense(tiny.VOCAB))
    p1 = np.zeros(tiny.VOCAB)
    for first in np.nonzero(p0)[0]:
        state = fork(base)
        after = engine.target(mx.array([[last, int(first)]]), state.cache)[0][0, -1]
        p1 += p0[first] * np.array(distribution(after, s).dense(tiny.VOCAB))
    drawn = []
    for seed in range(1000):
        decoder = engine.decoder(seed=seed, draft_tokens=2, report=False, lookup=False, temperature=1.0, top_k=64,
                                 top_p=0.95)
        drawn.append([r.token for r in decoder.generate(fork(base), 2)])
    drawn = np.array(drawn)
    assert chi_square_p(np.bincount(drawn[:, 0], minlength=tiny.VOCAB), p0) > ALPHA
    assert chi_square_p(np.bincount(drawn[:, 1], minlength=tiny.VOCAB), p1) > ALPHA


def test_the_same_text_with_another_image_never_resumes_the_first(engine):
    cache = PromptCache(engine.target, max_bytes=1 << 30)
    first = engine.generate(messages(IMAGE), max_tokens=8, mtp=False, image_tokens=IMAGE_TOKENS, cache=cache)
    other = messages({"type": "image", "image": picture(seed=5)})
    tokens, spans = engine.prepare(other, image_tokens=IMAGE_TOKENS)
    assert tokens[: spans[0].end] == engine.prepare(messages(IMAGE), image_tokens=IMAGE_TOKENS)[0][: spans[0].end]
    assert cache.sequences[0].resumable(tokens, spans) < spans[0].start  # it stops before the image
    again = engine.generate(other, max_tokens=8, mtp=False, image_tokens=IMAGE_TOKENS, cache=cache)
    fresh = engine.generate(other, max_tokens=8, mtp=False, image_tokens=IMAGE_TOKENS)
    assert again.tokens == fresh.tokens and again.stats.media_tokens == spans[0].item.tokens
    assert first.tokens != fresh.tokens or first.steps[0].prob != fresh.steps[0].prob


def test_a_second_turn_reuses_the_image(engine):
    """The next turn after an image turn runs no encoder and processes none of its soft tokens
    again (the caches hold everything up to the end of the first prompt), and its answer is a
    fresh run's over the whole conversation."""
    calls = []
    encoder = engine.media.encoder()
    embed = encoder.embed
    encoder.embed = lambda item: calls.append(item.digest) or embed(item)
    try:
        session = engine.chat(max_tokens=6, mtp=False, image_tokens=IMAGE_TOKENS)
        list(session.send(messages(IMAGE)[0]))
        assert len(calls) == 1 and session.last_stats.media_tokens > IMAGE_TOKENS // 2
        list(session.send("And now?"))
        turn = session.last_result
        assert len(calls) == 1 and turn.stats.media_tokens == 0
        image_end = engine.prepare(messages(IMAGE), image_tokens=IMAGE_TOKENS)[1][0].end
        assert turn.stats.prompt_reused > image_end
        fresh = engine.generate(session.messages[:-1], max_tokens=6, mtp=False, image_tokens=IMAGE_TOKENS)
        assert turn.tokens == fresh.tokens
    finally:
        encoder.embed = embed


def test_content_parts_in_every_shape_give_the_same_prompt(engine):
    png = io.BytesIO()
    from PIL import Image

    Image.fromarray(picture()).save(png, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    audio = clip()
    shapes = [
        [IMAGE, AUDIO],
        [{"type": "image_url", "image_url": {"url": data_url}},
         {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(audio)).decode(), "format": "wav"}}],
        [{"type": "image", "image": png.getvalue()}, {"type": "audio", "audio": (audio, 16_000)}],
        [{"type": "image", "image": png.getvalue()},
         {"type": "input_audio", "input_audio": {"data": base64.b64encode(flac_bytes(audio)).decode(), "format": "flac"}}],
        # base64 wrapped in lines (MIME's) and in the URL-safe alphabet: refused as "not valid
        # base64" before (a review)
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.encodebytes(png.getvalue()).decode()}},
         {"type": "input_audio", "input_audio": {"data": base64.urlsafe_b64encode(wav_bytes(audio)).decode(), "format": "wav"}}],
    ]
    prepared = [engine.prepare(messages(*parts), image_tokens=IMAGE_TOKENS) for parts in shapes]
    assert all(p[0] == prepared[0][0] for p in prepared)
    assert prepared[0][1][0].item.digest == prepared[1][1][0].item.digest == prepared[2][1][0].item.digest
    # WAV at 16 bits rounds the samples: the same token count, another digest
    assert [s.item.tokens for s in prepared[1][1]] == [s.item.tokens for s in prepared[0][1]]


@pytest.mark.parametrize("part, message", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "remote URLs are not fetched"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "not valid base64"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,rawtext"}}, "must be base64"),
    ({"type": "image", "image": b"not an image"}, "not an image Pillow can read"),
    ({"type": "image", "image": "/no/such/picture.png"}, "no such file"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aac"}}, "format 'aac'.*wav, mp3, flac, ogg"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}, "nor a format soundfile reads"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF").decode()}}, "not a PCM WAV"),
    ({"type": "audio", "audio": (np.zeros(100, np.float32), 44_100)}, "44100 Hz"),
    ({"type": "audio", "audio": np.zeros(0, np.float32)}, "empty"),
    ({"type": "image"}, "needs its content"),
    ({"type": "image", "image": 5}, "an image must be a path, encoded bytes, an array or a PIL image; got int"),  # (a TypeError)
    ({"type": "audio", "audio": ["a", "b"]}, "audio must be a WAV file's path or bytes"),  # (a ValueError)
])
def test_bad_media_parts_are_refused_by_name(engine, part, message):
    with pytest.raises(MediaError, match=message) as error:
        engine.generate(messages(part), max_tokens=2)
    assert "messages[0].content[1]" in str(error.value)


def test_a_media_token_written_in_the_text_is_text(engine):
    """`<|image|>` typed in a message's text is the text it is (TextSide.chat_tokens): the prompt
    has one image, the part's (it was refused as media that does not match the parts)."""
    tokens, spans = engine.prepare(messages(IMAGE, text="and <|image|> too"))
    alone, _ = engine.prepare(messages(IMAGE, text="and too"))
    assert len(spans) == 1 and spans[0].item.tokens == engine.prepare(messages(IMAGE))[1][0].item.tokens
    assert "<|image|>" in engine.tokenizer.decode(tokens[spans[0].end:])
    assert tokens.count(TOKEN["image"]) == alone.count(TOKEN["image"])
    with pytest.raises(Exception, match="image_tokens must be one of"):
        engine.generate(messages(IMAGE), image_tokens=100)


def test_media_needs_a_checkpoint_that_has_it(family):
    text_only = load(str(family("12b")["target"]), None, force=True)
    with pytest.raises(MediaError, match="text-only checkpoint"):
        text_only.prepare(messages(IMAGE))


# 600 soft tokens (64 samples each): longer than a prefill chunk of 512. The 12B's audio has no
# token cap: an hour-long recording is 90,000 of them.
LONG_AUDIO = {"type": "audio", "audio": clip(seed=4, samples=64 * 600)}


def test_a_long_clip_goes_through_in_chunks_like_text(engine, reference, monkeypatch):
    """An audio clip's soft tokens are causal, so a clip longer than a prefill chunk goes through
    in chunks, as text does: no sliding cache grows to hold the clip (a chunk used to stretch to
    an item's end, found by a review: on the 12B a 12 MB WAV, 9,400 soft tokens, held about
    3.3 GB of sliding K/V, against the 0.5 GB the server's admission counts). Its encoder runs
    once, and the answer is transformers' own, MTP on and off."""
    from mlx_spec.models.cache import SlidingWindowCache

    calls, encoder, widths = [], engine.media.encoder(), []
    embed, make_room = encoder.embed, SlidingWindowCache._make_room
    encoder.embed = lambda item: calls.append(item.kind) or embed(item)

    def recorded(cache, n_new, like_k, like_v):
        make_room(cache, n_new, like_k, like_v)
        widths.append(cache.keys.shape[2])

    monkeypatch.setattr(SlidingWindowCache, "_make_room", recorded)
    try:
        tokens, spans = engine.prepare(messages(LONG_AUDIO))
        assert spans[0].item.tokens == 600
        state = SequenceState(engine.target)
        engine.decoder(mtp=False).start(state, tokens, spans)
        assert calls == ["audio"]
        assert widths and max(widths) < spans[0].item.tokens  # a window, a chunk and the slack
    finally:
        encoder.embed = embed
    ids, kwargs = transformers_inputs(tokens, spans)
    kwargs.pop("mm_token_type_ids")
    expected = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=20,
                                  do_sample=False, cache_implementation="static", **kwargs)[0, len(tokens):].tolist()
    off = engine.generate(messages(LONG_AUDIO), max_tokens=20, mtp=False)
    assert off.tokens == expected[: len(off.tokens)] and len(off.tokens) > tiny.WINDOW
    assert engine.generate(messages(LONG_AUDIO), max_tokens=20, draft_tokens=3).tokens == off.tokens


def test_a_prompt_stopped_inside_a_clip_keeps_it_and_never_resumes_inside_it(engine):
    """A request cancelled while its clip goes through (the server stops between chunks, and a
    clip is now cut between them): the sequence keeps what went through with the clip recorded,
    so that no prompt with another clip, or none, reuses its soft tokens' keys and values; the
    same prompt again gives the uncached answer."""
    from mlx_spec.errors import PromptStopped

    tokens, spans = engine.prepare(messages(LONG_AUDIO))
    (span,) = spans
    state, asked = SequenceState(engine.target), []
    decoder = engine.decoder(mtp=False)
    decoder.prefill_chunk = 64
    with pytest.raises(PromptStopped):
        decoder.start(state, tokens, spans, stop=lambda: asked.append(1) or len(asked) == 3)
    assert span.start < len(state.tokens) < span.end and state.cached == len(state.tokens) - 1
    assert [s.key for s in state.spans] == [span.key]
    other_tokens, other_spans = engine.prepare(messages({"type": "audio", "audio": clip(seed=5, samples=64 * 600)}))
    assert other_tokens == tokens
    assert state.resumable(other_tokens, other_spans) <= span.start
    assert state.resumable(tokens, []) <= span.start  # the same ids as a raw prompt, no clip
    cache = PromptCache(engine.target, 1 << 30)
    cache.give_back(state)
    again = engine.generate(messages(LONG_AUDIO), max_tokens=8, mtp=False, cache=cache)
    assert again.tokens == engine.generate(messages(LONG_AUDIO), max_tokens=8, mtp=False).tokens


def test_an_encoder_giving_the_wrong_number_of_soft_tokens_is_caught_before_any_piece():
    """A clip cut between chunks is embedded once and sliced: an encoder that gives more rows
    than the clip's soft tokens would pass every slice's check (a review), so the whole is
    checked."""
    from mlx_spec.media.items import MediaItem

    span = MediaSpan(5, MediaItem("audio", 10, "d", ()), lambda: mx.zeros((12, 4))).embedded_once()
    with pytest.raises(ValueError, match=r"the audio encoder gave \(12, 4\) for 10 soft tokens"):
        span.piece(5, 8).embed()
