"""Answers held to a JSON schema, a regular expression or a Lark grammar, drafting on, exactly:
the same tokens as transformers' own greedy generation under llguidance's own mask (neither
written here), with every guess kept, none, and every count between, alone and per row of a
batch; seeded sampling the same with drafting on and off; every JSON answer valid by
`jsonschema`."""

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
import torch

import tiny
from mlx_spec import load
from mlx_spec.drafting import Draft
from mlx_spec.errors import SettingsError
from mlx_spec.options import Options
from scripted import ScriptedDrafter

LONG_LIST = {  # an answer many sliding windows (12) long, whatever the random model prefers
    "type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 24, "maxItems": 26,
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0},
                   "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False,
}
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def engine(checkpoints):
    """The tiny pair with its real stop tokens: a constraint ends the answer with one of them."""
    return load(str(checkpoints["text"]), str(checkpoints["assistant"]))


@pytest.fixture(scope="module")
def prompt():
    return np.random.RandomState(3).randint(0, tiny.VOCAB, size=2 * tiny.WINDOW + 5).tolist()


def transformers_constrained(checkpoints, engine, prompt, grammar_text):
    """transformers' greedy generation with llguidance's torch helpers masking every step: the
    ground truth, written by neither of us."""
    import llguidance
    import llguidance.hf
    import llguidance.torch
    from transformers import Gemma4ForCausalLM, LogitsProcessorList

    model = Gemma4ForCausalLM.from_pretrained(checkpoints["text"]).eval()
    stops = engine.stop_tokens
    tokenizer = llguidance.hf.from_tokenizer(engine.tokenizer._tokenizer, n_vocab=tiny.VOCAB, eos_token=stops)
    matcher = llguidance.LLMatcher(tokenizer, grammar_text)
    bitmask = llguidance.torch.allocate_token_bitmask(1, tiny.VOCAB)

    def mask(input_ids, scores):
        if input_ids.shape[1] > len(prompt):
            assert matcher.consume_token(int(input_ids[0, -1]))
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        llguidance.torch.apply_token_bitmask_inplace(scores, bitmask)
        return scores

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             logits_processor=LogitsProcessorList([mask]), eos_token_id=stops, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def schema_text(schema):
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})


@pytest.fixture(scope="module")
def expected(checkpoints, engine, prompt):
    """{name: (options' constraint, transformers' constrained answer)}."""
    import llguidance

    cases = {"list": ({"json_schema": LONG_LIST}, schema_text(LONG_LIST)),
             "person": ({"json_schema": PERSON}, schema_text(PERSON)),
             "regex": ({"regex": r"[a-z]{20,40}\.[0-9]{2,4}"}, llguidance.LLMatcher.grammar_from_regex(r"[a-z]{20,40}\.[0-9]{2,4}"))}
    return {name: (given, transformers_constrained(checkpoints, engine, prompt, text)) for name, (given, text) in cases.items()}


@pytest.mark.parametrize("case", ["list", "person", "regex"])
@pytest.mark.parametrize("drafting", [{"mtp": False}, {}, {"lookup": False}, {"draft_tokens": 1}, {"draft_tokens": 3},
                                      {"draft_tokens": 8}])
def test_greedy_equals_transformers_under_the_same_mask(engine, prompt, expected, case, drafting):
    given, reference = expected[case]
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, **given, **drafting)
    assert result.tokens == reference
    assert result.finish_reason == "stop" and result.tokens[-1] in engine.stop_tokens
    if "json_schema" in given:
        jsonschema.validate(json.loads(result.text), given["json_schema"])
    if drafting.get("mtp") is not False:
        assert result.stats.drafted > 0


def test_the_long_answer_runs_past_several_windows(expected):
    assert len(expected["list"][1]) > 5 * tiny.WINDOW


@pytest.mark.parametrize("g", [1, 2, 4, 7])
@pytest.mark.parametrize("break_at", [None, 0, "between"])
def test_all_none_and_some_guesses_kept(engine, prompt, expected, g, break_at):
    """A drafter that proposes the constrained answer itself (all kept), breaks its first guess
    (none kept), or a guess between: the same tokens, and as many kept as it allows."""
    given, reference = expected["list"]
    at = g // 2 if break_at == "between" else break_at
    drafter = ScriptedDrafter(prompt + reference, tiny.VOCAB, break_at=at)
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, drafter=drafter, draft_tokens=g, **given)
    assert result.tokens == reference
    kept_per_cycle = g if at is None else at
    cycles = result.stats.cycles
    assert result.stats.kept >= kept_per_cycle * (cycles - 1)
    if at == 0:
        assert result.stats.kept == 0


def test_a_guess_the_grammar_forbids_is_never_kept(engine, prompt, expected):
    """Every guess a special token no JSON grammar allows: none is kept, and the answer is the
    constrained one."""
    given, reference = expected["person"]
    forbidden = tiny.REAL_SPECIAL_IDS["<|tool_call>"]
    drafter = ScriptedDrafter(prompt + [forbidden] * (MAX_TOKENS + 10), tiny.VOCAB, strict=False)
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, drafter=drafter, draft_tokens=3, **given)
    assert result.tokens == reference
    assert result.stats.drafted > 0 and result.stats.kept == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 40, "top_p": 0.9}])
def test_seeded_sampling_is_the_same_with_drafting_on_and_off(engine, prompt, seed, settings):
    off = engine.generate(prompt, max_tokens=MAX_TOKENS, json_schema=PERSON, seed=seed, mtp=False, **settings)
    for drafting in ({}, {"draft_tokens": 2}, {"lookup": False, "draft_tokens": 5}):
        on = engine.generate(prompt, max_tokens=MAX_TOKENS, json_schema=PERSON, seed=seed, **drafting, **settings)
        assert on.tokens == off.tokens
    jsonschema.validate(json.loads(off.text), PERSON)


def test_rows_of_a_batch_each_get_their_own_answer(engine, prompt, expected):
    """Constrained and free rows side by side, each what it is alone."""
    other = np.random.RandomState(9).randint(0, tiny.VOCAB, size=40).tolist()
    requests = [(prompt, Options(max_tokens=MAX_TOKENS, json_schema=LONG_LIST)),
                (other, Options(max_tokens=60)),
                (prompt, Options(max_tokens=MAX_TOKENS, regex=expected["regex"][0]["regex"], draft_tokens=2)),
                (other, Options(max_tokens=MAX_TOKENS, json_schema=PERSON, temperature=1.0, seed=5)),
                (prompt, Options(max_tokens=MAX_TOKENS, json_schema=PERSON, mtp=False))]
    together = engine.generate_many([p for p, _ in requests], [o for _, o in requests])
    for (p, options), result in zip(requests, together):
        assert result.tokens == engine.generate(p, options).tokens
    assert together[0].tokens == expected["list"][1]
    assert together[4].tokens == expected["person"][1]


def test_reports_give_the_model_s_own_and_the_restricted_probability(engine, prompt):
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, json_schema=PERSON, temperature=1.0, seed=0)
    first = result.steps[0]
    assert first.text == "{" and first.sampling_prob == 1.0 and first.candidates == 1  # the only token allowed
    assert first.prob < 0.5  # the random model's own probability of it
    assert all(s.sampling_prob >= s.prob * 0.999 for s in result.steps)  # restricting only raises a token's share


def test_tokens_taken_back_take_the_matcher_back(engine, expected):
    """What a row settles and then takes back (a reader that left early) leaves the matcher where
    it was: its masks are those of the tokens still settled, a stop token counted as a token."""
    given, reference = expected["person"]
    grammar = Options(**given).constraint
    walked, fresh = engine.grammars.matcher(grammar), engine.grammars.matcher(grammar)
    walked.advance(reference)  # to the stop token at its end
    walked.take_back(6)
    fresh.advance(reference[:-6])
    assert np.array_equal(walked.masks(reference[-6:-3])[0], fresh.masks(reference[-6:-3])[0])


def test_leaving_a_constrained_stream_early_leaves_the_engine_exact(engine, prompt, expected):
    given, reference = expected["person"]
    stream = engine.stream(prompt, max_tokens=MAX_TOKENS, **given)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert stream.result.tokens == reference[: len(stream.result.tokens)]
    assert engine.generate(prompt, max_tokens=MAX_TOKENS, **given).tokens == reference


@pytest.mark.parametrize("settings, message", [
    ({"json_schema": {"type": "objectx"}}, "json schema cannot be used"),
    ({"regex": "(unclosed"}, "regex cannot be used"),
    ({"grammar": "start: undefined_rule"}, "grammar cannot be used"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"json_schema": [1, 2]}, "must be a JSON object"),
    ({"json_schema": PERSON, "regex": "a"}, "one constraint at a time"),
    ({"regex": "[a-z]+", "thinking": True}, "regex with thinking on is not supported"),
])
def test_bad_constraints_are_named(engine, prompt, settings, message):
    with pytest.raises(SettingsError, match=message):
        engine.generate(prompt, max_tokens=8, **settings)


def test_a_checkpoint_without_a_tokenizer_says_why(checkpoints, prompt):
    bare = load(str(checkpoints["google"]), drafter=None)
    with pytest.raises(SettingsError, match="tokenizer"):
        bare.generate(prompt, max_tokens=8, regex="[a-z]+")


def test_a_lark_grammar(engine, prompt):
    grammar = 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]{1,3}/'
    result = engine.generate(prompt, max_tokens=20, grammar=grammar)
    assert result.text in ("yes", "no") or (result.text.startswith("maybe ") and result.text[6:].isdigit())
    assert result.tokens == engine.generate(prompt, max_tokens=20, grammar=grammar, mtp=False).tokens


def test_the_mask_unpacks_as_llguidance_packs_it():
    """Every bit of llguidance's packed mask lands on its token (bit 31 included, a negative word)."""
    from mlx_spec.sampling.masks import allowed, words_for

    rng = np.random.RandomState(0)
    vocab = 1000
    chosen = rng.rand(vocab) < 0.3
    packed = np.packbits(np.concatenate([chosen, np.zeros(words_for(vocab) * 32 - vocab, bool)]), bitorder="little")
    words = packed.view(np.int32)
    assert np.array_equal(np.array(allowed(mx.array(words), vocab)), chosen)


def test_a_constrained_cycle_with_guesses_syncs_once_more(engine, prompt, expected):
    """Its guesses are read on the host before the pass is built (for the masks along them):
    one sync more in such a cycle, none in any other, and every one counted."""
    given, reference = expected["list"]
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, draft_tokens=3, lookup=False, **given)
    with_guesses = sum(n for g, n in result.stats.cycles_by_g.items() if g > 0)
    assert with_guesses > 0
    assert result.stats.host_syncs == result.stats.cycles + with_guesses


def test_the_tokens_a_grammar_forces_are_drafted_and_kept(engine, prompt, expected):
    """A JSON schema's keys, quotes and colons are forced: drafted whenever the grammar has some
    (the draft length's choice aside), nearly all kept, in fewer cycles than MTP off takes; not
    with MTP off, nor with a drafter of the caller's own."""
    given, reference = expected["person"]
    result = engine.generate(prompt, max_tokens=MAX_TOKENS, **given)
    assert result.tokens == reference
    drafted, kept = result.stats.drafted_by_source["grammar"], result.stats.kept_by_source["grammar"]
    assert drafted >= 10 and kept >= 0.8 * drafted
    assert result.stats.cycles < len(reference) - kept + 1
    off = engine.generate(prompt, max_tokens=MAX_TOKENS, mtp=False, **given)
    assert "grammar" not in off.stats.drafted_by_source and off.stats.cycles == len(reference)
    own = ScriptedDrafter(prompt + reference, tiny.VOCAB, break_at=0)
    mine = engine.generate(prompt, max_tokens=MAX_TOKENS, drafter=own, draft_tokens=2, **given)
    assert "grammar" not in mine.stats.drafted_by_source and mine.stats.kept == 0


SWEEP = {  # real schemas' features; strings bounded, so that a random model's answer ends
    "nested": {"type": "object", "additionalProperties": False, "required": ["user", "tags"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["id"], "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999}, "email": {"type": "string", "maxLength": 12}}},
        "tags": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"enum": ["a", "b", "c"]}}}},
    "anyOf and $ref": {"$defs": {"point": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                                           "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1},
                                                          "y": {"type": "number"}}}},
                       "type": "object", "additionalProperties": False, "required": ["shape"], "properties": {
                           "shape": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"},
                                               {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2}]}}},
    "pattern and optional keys": {"type": "object", "additionalProperties": False, "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, "note": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"}, "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 10}}},
}


@pytest.mark.parametrize("name", list(SWEEP))
def test_a_random_model_s_answers_validate_for_every_seed(engine, prompt, name):
    """The tiny random model, whose free output is garbage: every answer under a real schema's
    features parses and validates, greedy and at every seed of a sweep, drafting on == off."""
    schema = SWEEP[name]
    for seed in [None, 0, 1, 2, 3, 4]:
        sampling = {} if seed is None else {"temperature": 1.0, "seed": seed}
        result = engine.generate(prompt, max_tokens=MAX_TOKENS, json_schema=schema, **sampling)
        assert result.finish_reason == "stop", (seed, result.text)
        jsonschema.validate(json.loads(result.text), schema)
        assert result.tokens == engine.generate(prompt, max_tokens=MAX_TOKENS, json_schema=schema, mtp=False,
                                                **sampling).tokens


def test_a_constrained_position_samples_the_restricted_distribution():
    """The chi-square test at a constrained position: the token drawn (the guess kept, or the
    target's own draw) follows the target's distribution restricted to the allowed tokens and
    renormalised, at temperature 0.7 and top-p 0.9."""
    from scipy.stats import chisquare

    from mlx_spec.models.traces import TraceCache
    from mlx_spec.decoding.verify import Verifier
    from mlx_spec.sampling.distribution import distribution
    from mlx_spec.sampling.masks import words_for
    from mlx_spec.sampling.settings import SamplingSettings

    vocab, draws = 64, 40000
    rng = np.random.RandomState(0)
    logits = mx.array(rng.randn(vocab).astype(np.float32) * 2)
    allowed = rng.rand(vocab) < 0.4
    packed = np.packbits(np.concatenate([allowed, np.zeros(words_for(vocab) * 32 - vocab, bool)]), bitorder="little")
    mask = mx.array(packed.view(np.int32))
    settings = SamplingSettings(temperature=0.7, top_p=0.9)
    guess = int(np.flatnonzero(allowed)[0])
    verifier = Verifier(settings, False, TraceCache())
    uniforms = mx.array(rng.rand(draws, 2, 2).astype(np.float32))
    kept, tokens, _ = verifier.by_match(mx.broadcast_to(logits, (draws, 2, vocab)), mx.full((draws, 1), guess, mx.int32),
                                        uniforms, mx.broadcast_to(mask, (draws, 2, mask.shape[0])))
    first = np.array(tokens[:, 0])
    restricted = mx.where(mx.array(allowed), logits, -mx.inf)
    expected = np.array(distribution(restricted[None], settings).dense(vocab)[0])
    assert allowed[first].all()  # nothing outside the mask is ever drawn
    support = expected > 0
    observed = np.bincount(first, minlength=vocab)[support]
    assert observed.sum() == draws
    want = expected[support].astype(np.float64)
    assert chisquare(observed, want / want.sum() * draws).pvalue > 1e-3


BRANCHY = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["k", "v"],
                      "properties": {"k": {"type": "array", "items": {"type": "integer"}}, "v": {"const": i}}}
                     for i in range(350)]}  # (walking into it takes llguidance past its parser's row limit)


def test_a_guess_that_breaks_the_matcher_is_not_kept_and_breaks_nothing(engine, prompt):
    """Guesses that walk a grammar into one of the matcher's limits (on a path the answer never
    takes): the walk is on a copy, none from there on is kept, and the answer is MTP off's."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 8}, "x": BRANCHY}}
    poison = engine.tokenizer.encode('","x":{', add_special_tokens=False)

    class Poison:
        def draft(self, context, g):
            return Draft(mx.array(poison[:g], dtype=mx.int32), source="fixed")

    off = engine.generate(prompt, max_tokens=60, json_schema=schema, mtp=False)
    on = engine.generate(prompt, max_tokens=60, json_schema=schema, drafter=Poison(), draft_tokens=len(poison))
    assert on.tokens == off.tokens


def test_a_request_whose_grammar_fails_ends_alone(engine, prompt):
    """A schema past the matcher's limits fails its own row of a batch (a SettingsError,
    mid-answer); the free row decoding beside it goes on to its own answer."""
    from mlx_spec.decoding.batch import Batch
    from mlx_spec.generation import Generation
    from mlx_spec.decoding.reports import WAITING

    huge = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(3000)}}
    other = np.random.RandomState(9).randint(0, tiny.VOCAB, size=40).tolist()
    batch = Batch(engine.target, engine.draft_lengths)
    runs = [Generation(engine, prompt, Options(max_tokens=60, json_schema=huge), batch=batch),
            Generation(engine, other, Options(max_tokens=60), batch=batch)]
    streams, got, errors = [iter(r) for r in runs], [[], []], [None, None]
    while batch.rows or any(s is not None for s in streams):
        for i, events in enumerate(streams):
            try:
                while events is not None and (event := next(events, None)) is not WAITING:
                    if event is None:
                        streams[i] = events = None
                    else:
                        got[i].append(event.token)
            except SettingsError as e:
                errors[i], streams[i], events = e, None, None
        batch.step()
    assert errors[0] is not None and "gave up" in str(errors[0]) and errors[1] is None
    assert got[1] == engine.generate(other, max_tokens=60).tokens
