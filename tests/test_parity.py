"""The MLX target and drafter compute what transformers computes (float32, tiny checkpoints)."""

import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from mlx_spec.models import load_drafter, load_target
from mlx_spec.models.gemma4.facts import FULL, SLIDING
from kv import exact_kv, fresh_cache, prefill, step_kv

TOL = 1e-4
PROMPT_LEN = 5 * tiny.WINDOW  # several windows long
DECODE_LEN = 2 * tiny.WINDOW


def reference_target(folder, layout):
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    cls = Gemma4ForCausalLM if layout == "text" else Gemma4ForConditionalGeneration
    return cls.from_pretrained(folder).eval()


def random_ids(n, seed=0):
    return np.random.RandomState(seed).randint(0, tiny.VOCAB, size=(1, n))


@pytest.mark.parametrize("layout", ["text", "google"])
def test_target_matches_transformers_prefill_and_decode(checkpoints, layout):
    ids = random_ids(PROMPT_LEN + DECODE_LEN)
    ref = reference_target(checkpoints[layout], layout)
    with torch.no_grad():
        out = ref(torch.tensor(ids), output_hidden_states=True)
    ref_logits = out.logits.numpy()[0]
    ref_hidden = out.hidden_states[-1].numpy()[0]  # post-final-norm, as the drafter reads it

    target, _ = load_target(str(checkpoints[layout]))
    cache = fresh_cache(target)
    # Prefill in uneven chunks so the sliding cache reallocates and wraps mid-chunk.
    logits, hidden = [], []
    for lo, hi in [(0, 7), (7, 30), (30, PROMPT_LEN)]:
        l, h = target(mx.array(ids[:, lo:hi]), cache)
        logits.append(np.array(l)[0])
        hidden.append(np.array(h)[0])
    for i in range(PROMPT_LEN, PROMPT_LEN + DECODE_LEN):
        l, h = target(mx.array(ids[:, i : i + 1]), cache)
        logits.append(np.array(l)[0])
        hidden.append(np.array(h)[0])
    logits, hidden = np.concatenate(logits), np.concatenate(hidden)

    assert np.abs(logits - ref_logits).max() <= TOL
    assert np.abs(hidden - ref_hidden).max() <= TOL


def test_prefill_in_chunks_equals_one_pass(checkpoints):
    target, _ = load_target(str(checkpoints["text"]))
    ids = mx.array(random_ids(PROMPT_LEN, seed=3))
    whole = target.hidden(ids, fresh_cache(target))[:, -1:]
    chunked = prefill(target, ids, fresh_cache(target), chunk=tiny.WINDOW - 5)
    assert np.abs(np.array(whole) - np.array(chunked)).max() <= 1e-5


def test_both_layouts_load_to_the_same_model(checkpoints):
    ids = mx.array(random_ids(40, seed=5))
    a, _ = load_target(str(checkpoints["text"]))
    b, _ = load_target(str(checkpoints["google"]))
    la, _ = a(ids, fresh_cache(a))
    lb, _ = b(ids, fresh_cache(b))
    assert np.array_equal(np.array(la), np.array(lb))


def test_kv_source_layers_come_from_the_config(checkpoints):
    target, _ = load_target(str(checkpoints["text"]))
    # Tiny layout: 10 layers (S S S S F S S S S F), 4 shared: layers 0-5 compute K/V.
    assert target.kv_layers == {SLIDING: 5, FULL: 4}


def reference_target_state(checkpoints, ids):
    """transformers' hidden state of the last processed position and its shared K/V."""
    from transformers import Gemma4ForCausalLM

    ref_target = Gemma4ForCausalLM.from_pretrained(checkpoints["text"]).eval()
    with torch.no_grad():
        out = ref_target(torch.tensor(ids), output_hidden_states=True, return_shared_kv_states=True)
    return ref_target, out.hidden_states[-1][:, -1:], dict(out.shared_kv_states)


def test_drafter_reads_the_kv_transformers_gives_it(checkpoints):
    """The drafter's view of the target's caches, after wraps: the last window + 1 positions of
    the sliding source layer (what transformers' assistant mask keeps), all of the full one."""
    ids = random_ids(4 * tiny.WINDOW + 2, seed=7)
    _, ref_hidden, ref_kv = reference_target_state(checkpoints, ids)
    target, _ = load_target(str(checkpoints["text"]))
    cache = fresh_cache(target)
    hidden = prefill(target, mx.array(ids), cache, chunk=tiny.WINDOW - 3)
    view = exact_kv(target, cache)
    assert np.abs(np.array(hidden) - ref_hidden.numpy()).max() <= TOL
    span = {SLIDING: tiny.WINDOW + 1, FULL: ids.shape[1]}
    for kind, (keys, values) in view.items():
        ref_keys, ref_values = (x.numpy()[..., -span[kind] :, :] for x in ref_kv[kind])
        assert keys.shape == ref_keys.shape
        assert np.abs(np.array(keys) - ref_keys).max() <= TOL
        assert np.abs(np.array(values) - ref_values).max() <= TOL


@pytest.mark.parametrize("ordered", [True, False])
def test_drafter_matches_transformers_over_several_steps(checkpoints, ordered):
    """Fed the same inputs, four consecutive draft steps give transformers' logits, argmax and
    next hidden state."""
    from transformers import Gemma4AssistantForCausalLM

    folder = checkpoints["assistant" if ordered else "assistant_plain"]
    ids = random_ids(4 * tiny.WINDOW + 3, seed=7)  # the last token is not yet processed
    ref_target, ref_hidden, ref_kv = reference_target_state(checkpoints, ids[:, :-1])
    ref_drafter = Gemma4AssistantForCausalLM.from_pretrained(folder).eval()
    drafter, _ = load_drafter(str(folder))
    kv = {k: (mx.array(v[0].numpy()), mx.array(v[1].numpy())) for k, v in ref_kv.items()}
    kv[SLIDING] = tuple(x[..., -(tiny.WINDOW + 1) :, :] for x in kv[SLIDING])
    token = torch.tensor(ids[:, -1:])
    position = ids.shape[1] - 1  # transformers' convention: the position of the last settled token

    for _ in range(4):
        embedding = ref_target.get_input_embeddings()(token)
        with torch.no_grad():
            r = ref_drafter(
                inputs_embeds=torch.cat([embedding, ref_hidden], dim=-1),
                position_ids=torch.tensor([[position]]),
                shared_kv_states=ref_kv,
            )
        h, next_hidden = drafter.step(
            mx.array(embedding.detach().numpy()), mx.array(ref_hidden.numpy()), step_kv(drafter, kv), position
        )
        ref_logits = r.logits.numpy()[0, 0]
        if ordered:
            ids_c, logits_c = (np.array(x)[0, 0] for x in drafter.candidate_logits(h))
            # The same candidates (transformers fills every other id with min - 1), same logits.
            assert set(np.nonzero(ref_logits > ref_logits.min())[0]) <= set(ids_c.tolist())
            assert np.abs(logits_c - ref_logits[ids_c]).max() <= TOL
            full = np.array(drafter.full_logits(h))[0, 0]
            assert np.isneginf(full).sum() == tiny.VOCAB - len(set(ids_c.tolist()))
            assert np.array_equal(full[ids_c], logits_c)
        else:
            full = np.array(drafter.full_logits(h))[0, 0]
            assert np.abs(full - ref_logits).max() <= TOL
        assert np.abs(np.array(next_hidden) - r.last_hidden_state.numpy()).max() <= TOL
        assert drafter.greedy_token(h).item() == int(ref_logits.argmax())
        token, ref_hidden = torch.tensor([[int(ref_logits.argmax())]]), r.last_hidden_state


def test_plain_greedy_equals_transformers_generate(checkpoints):
    from transformers import Gemma4ForCausalLM

    steps = 200
    ids = random_ids(2 * tiny.WINDOW, seed=11)
    ref = Gemma4ForCausalLM.from_pretrained(checkpoints["text"]).eval()
    with torch.no_grad():
        expected = ref.generate(
            torch.tensor(ids), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
        )[0, ids.shape[1] :].tolist()

    target, _ = load_target(str(checkpoints["text"]))
    cache = fresh_cache(target)
    hidden = prefill(target, mx.array(ids), cache)
    got = []
    for _ in range(steps):
        token = mx.argmax(target.logits(hidden)[:, -1], axis=-1)
        got.append(token.item())
        _, hidden = target(token[None], cache)
    assert got == expected
