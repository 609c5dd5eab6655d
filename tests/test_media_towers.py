"""Images through the vision tower of Gemma 4 E2B (per-layer embeddings) and 31B (none; keys
equal to values), and audio through E2B's audio tower, on tiny google-layout checkpoints, against
transformers' `Gemma4ForConditionalGeneration`: the prompt's logits, and greedy generation with
MTP on and off past the sliding window. The 31B, which has no audio tower, refuses audio clearly.
E2B converted by mlx-vlm's own converter loads to the same media."""

import json
import shutil

import numpy as np
import pytest
import torch

import test_audio_tower
import tiny
from mlx_spec import load
from mlx_spec.errors import MediaError
from test_media_prompt import IMAGE, IMAGE_TOKENS, assert_greedy_is_the_targets, gemma4_masks, messages, our_prompt_logits, picture

# IMAGE_TOKENS 70, with 4-pixel patches pooled 3 x 3: a 40 x 56 picture is 63 soft tokens, five windows of 12
SECOND = {"type": "image", "image": picture(seed=7, shape=(24, 60))}
# 1.3 s of tones and noise: 33 soft tokens, the audio tower's attention over three chunks
SPEECH = {"type": "audio", "audio": test_audio_tower.clip(20800)}


@pytest.fixture(scope="module", params=["e2b", "31b"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"towers-{request.param}")
    target = tiny.build_target(root / "target", layout="google", variant=request.param)
    return target, tiny.build_family_assistant(root / "assistant", request.param)


@pytest.fixture(scope="module")
def engine(pair):
    return load(str(pair[0]), str(pair[1]), force=True)


@pytest.fixture(scope="module")
def reference(pair):
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(pair[0], dtype=torch.float32).eval()


def transformers_inputs(tokens, spans):
    """What transformers' image processor gives for these images (unpadded: one image's patches
    are a multiple of the pooling), and the token types."""
    ids = torch.tensor([tokens])
    images = [s.item.arrays for s in spans if s.item.kind == "image"]
    kwargs = {"mm_token_type_ids": (ids == tiny.MEDIA_IDS["<|image|>"]).long()
              + 3 * (ids == tiny.MEDIA_IDS["<|audio|>"]).long()}
    for features, mask in [s.item.arrays for s in spans if s.item.kind == "audio"]:
        kwargs.update(input_features=torch.tensor(features)[None], input_features_mask=torch.tensor(mask)[None])
    if images:
        size = max(len(p) for p, _ in images)
        pixels = torch.zeros(len(images), size, images[0][0].shape[1])
        where = torch.full((len(images), size, 2), -1, dtype=torch.long)
        for n, (patches, positions) in enumerate(images):
            pixels[n, : len(patches)], where[n, : len(positions)] = torch.tensor(patches), torch.tensor(positions)
        kwargs.update(pixel_values=pixels, image_position_ids=where)
    return ids, kwargs


CASES = {"one image": [IMAGE], "two images": [IMAGE, SECOND], "audio": [SPEECH], "image and audio": [IMAGE, SPEECH]}


def needs_audio(engine, media):
    if any(m["type"] == "audio" for m in media) and not engine.media.encoder().can["audio"]:
        pytest.skip("this size has no audio tower (audio_config is null, as google ships the 31B)")


@pytest.mark.parametrize("case", CASES)
def test_prompt_logits_match_transformers(engine, reference, pair, case):
    """Every position's logits, against transformers in float64: no further from it than three
    times transformers' own float32."""
    from transformers import Gemma4ForConditionalGeneration

    needs_audio(engine, CASES[case])
    tokens, spans = engine.prepare(messages(*CASES[case]), image_tokens=IMAGE_TOKENS)
    # (SECOND, a wide picture, has its own count: it is held to transformers' below.)
    assert len(spans) == len(CASES[case]) and all(s.item.tokens > 0 for s in spans)
    assert [s.item.tokens for m, s in zip(CASES[case], spans) if m is not SECOND] == [
        {"image": 63, "audio": 33}[m["type"]] for m in CASES[case] if m is not SECOND]
    ids, kwargs = transformers_inputs(tokens, spans)
    masks = gemma4_masks(reference, ids, kwargs.pop("mm_token_type_ids"))
    precise = Gemma4ForConditionalGeneration.from_pretrained(pair[0], dtype=torch.float64).eval()
    if precise.model.audio_tower is not None:
        # transformers' audio attention mixes in float32 constants, so it cannot run in float64:
        # its tower stays in float32 (its soft tokens enter the float64 model as they are).
        precise.model.audio_tower.float(), precise.model.embed_audio.float()
    with torch.no_grad():
        expected = precise(input_ids=ids, attention_mask=masks, **{
            k: v.double() if v.is_floating_point() and k != "input_features" else v
            for k, v in kwargs.items()}).logits[0].numpy()
        float32 = reference(input_ids=ids, attention_mask=masks, **kwargs).logits[0].numpy()
    ours = our_prompt_logits(engine, tokens, spans)
    own_error = np.abs(float32 - expected).max()
    assert np.abs(ours - expected).max() <= 3 * own_error + 1e-5


@pytest.mark.parametrize("case", ["one image", "image and audio"])
def test_greedy_with_media_is_the_targets_past_the_window(engine, reference, case):
    needs_audio(engine, CASES[case])
    assert_greedy_is_the_targets(engine, reference, messages(*CASES[case]), transformers_inputs)


def test_a_size_without_an_audio_tower_refuses_audio_clearly(engine):
    if engine.media.encoder().can["audio"]:
        pytest.skip("this size has an audio tower (E2B)")
    with pytest.raises(MediaError, match="has no audio encoder .*cannot take audio input"):
        engine.prepare(messages(SPEECH))


def test_mlx_vlm_s_own_conversion_loads_with_the_same_media(pair, tmp_path):
    """The mlx-community layout as mlx-vlm's converter writes it (keys without `model.`, the
    language model at 4 bits, the towers kept as they were): an image's and a clip's soft tokens
    equal those from google's files, and drafting stays exact on the quantized target."""
    pytest.importorskip("mlx_vlm", reason="mlx-vlm (its converter writes the layout) is not installed")
    from mlx_vlm.convert import convert

    if json.loads((pair[0] / "config.json").read_text()).get("audio_config") is None:
        pytest.skip("one size is enough: E2B, which has both towers")
    google = tmp_path / "google"
    shutil.copytree(pair[0], google)
    converted = tmp_path / "converted"
    tiny.save_processor_config(google)
    convert(str(tiny.stated_head_size(google)), str(converted), quantize=True, q_group_size=64, q_bits=4)
    prompt = messages(IMAGE, SPEECH)
    original = load(str(google), None, force=True).prepare(prompt, image_tokens=IMAGE_TOKENS)[1]
    engine = load(str(converted), str(pair[1]), force=True)
    spans = engine.prepare(prompt, image_tokens=IMAGE_TOKENS)[1]
    for ours, theirs in zip(spans, original):
        assert ours.item == theirs.item and np.abs(np.array(ours.embed()) - np.array(theirs.embed())).max() <= 1e-6
    off = engine.generate(prompt, max_tokens=30, mtp=False, image_tokens=IMAGE_TOKENS)
    assert engine.generate(prompt, max_tokens=30, draft_tokens=6, image_tokens=IMAGE_TOKENS).tokens == off.tokens
