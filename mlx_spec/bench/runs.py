"""Timed generation runs: ours (MTP on or off, any drafter) and mlx-lm's, measured alike.

Decode speed everywhere is the tokens that came after the first batch over the time from that
batch to the last token. A batch is what one step hands over at once: a token for mlx-lm or
MTP off, a cycle's tokens with drafting. For one token per step this is mlx-lm's
stream_generate figure, (tokens - 1) / (time of the last - time of the first): the prompt and
the first token are left out, so prefill never hides in it. A cycle's tokens all arrive at
once, so counting the first cycle's tokens but not its time would credit a run with a long
first draft (g = 8 kept whole: 8 tokens in no time) over one that starts short.
"""

import json
import statistics
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..decoding.sequence import SequenceState
from ..drafting import Draft, DraftContext, Drafter
from ..drafting.pieces import run_through
from ..sampling.settings import SamplingSettings
from .prefills import prompt_sequence

WORKLOADS = Path(__file__).parent / "workloads.json"
SAMPLING = {"greedy": SamplingSettings.named("greedy"), "gemma": SamplingSettings.named("gemma")}
# The workloads a --quick run measures: two with short prompts, at the far ends of the seed's
# (most and fewest guesses kept), so that `bench all --quick` keeps to its 10 minutes.
QUICK_WORKLOADS = "tool call,long Chinese text"
# The seed measured without thinking; the prompts are rendered so, and the tables say it.
TEMPLATE = {"chat template": "thinking off, as the seed measured"}


def workload_names() -> list:
    return [w["name"] for w in json.loads(WORKLOADS.read_text())["workloads"]]


def workloads(engine, names=None):
    """(name, prompt token ids, max_tokens) for each workload in workloads.json. Without a
    tokenizer (random weights) the prompt is random tokens of a similar length."""
    data = json.loads(WORKLOADS.read_text())
    rng = np.random.default_rng(0)
    out = []
    for w in data["workloads"]:
        if names and w["name"] not in names:
            continue
        if engine.tokenizer is not None:
            prompt = engine.encode(w["messages"], data["tools"] if w["tools"] else None, thinking=False)
        else:
            prompt = rng.integers(0, engine.target.vocab_size, w["random_prompt_tokens"]).tolist()
        out.append((w["name"], prompt, w["max_tokens"]))
    return out


def rate(times, batches=None) -> float:
    """Tokens per second after the first batch (see above). `batches`: each token's batch (a
    cycle number, say), in order; None: each token its own."""
    first = batches.count(batches[0]) if batches else 1
    if len(times) <= first or times[-1] <= times[first - 1]:
        return 0.0
    return (len(times) - first) / (times[-1] - times[first - 1])


def run_ours(engine, prompt, settings: SamplingSettings, max_tokens, mtp=None, draft_tokens=None, drafter=None,
             lookup=True, report=False, spans=(), prefills=None):
    """mlx-spec: by default as users get it (adaptive draft length, lookup + MTP). `spans`: the
    prompt's images and audio (`engine.prepare`). `prefills`: resume the prompt's sequence
    (prefills.py) instead of putting the whole prompt through the target again."""
    decoder = engine.decoder(
        temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed or 0,
        mtp=mtp, draft_tokens=draft_tokens, drafter=drafter, lookup=lookup, report=report,
    )
    tokens, times, cycles = [], [], []
    with prompt_sequence(engine, decoder, prompt, spans, prefills) as state:
        stream = decoder.generate(state, max_tokens)
        if engine.tokenizer is not None:
            stream = engine.text.with_text(stream)  # detokenize, as stream_generate does
        for report_ in stream:
            tokens.append(report_.token)
            times.append(time.perf_counter())
            cycles.append(report_.cycle)
    s = decoder.stats
    return {"tokens": tokens, "tps": rate(times, cycles), "drafted": s.drafted, "kept": s.kept, "cycles": s.cycles,
            "prebuilt_share": s.prebuilt_share, "exposed_host_ms": s.exposed_host_ms, "waited_ms": s.waited_ms,
            "build_ms": s.build_ms, "launch_ms": s.launch_ms,
            "ms_per_cycle": 1000 * s.generation_seconds / max(s.cycles, 1),
            "tokens_per_cycle": len(tokens) / max(s.cycles, 1), "prompt_tps": s.prompt_tps,
            "cycles_by_g": dict(s.cycles_by_g), "kept_by_position": list(s.kept_by_position),
            "kept_by_source": dict(s.kept_by_source),
            "drafted_by_source": dict(s.drafted_by_source)}


def run_mlx_lm(engine, prompt, settings: SamplingSettings, max_tokens, stop=True):
    """mlx-lm on the same model: stream_generate with a tokenizer (it stops at the tokenizer's
    end-of-sequence tokens), its generate_step without one or with stop=False (no stops)."""
    from mlx_lm.generate import generate_step, stream_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(settings.seed or 0)
    sampler = make_sampler(temp=settings.temperature, top_p=settings.top_p if settings.top_p < 1 else 0.0, top_k=settings.top_k)
    tokens, times = [], []
    if engine.tokenizer is not None and stop:
        for response in stream_generate(engine.target.model, engine.tokenizer, prompt, max_tokens=max_tokens, sampler=sampler):
            tokens.append(response.token)
            times.append(time.perf_counter())
            if response.finish_reason:
                break
        how = "stream_generate"
    else:
        for token, _ in generate_step(mx.array(prompt), engine.target.model, max_tokens=max_tokens, sampler=sampler):
            tokens.append(int(token))
            times.append(time.perf_counter())
        how = "generate_step"
    return {"tokens": tokens, "tps": rate(times), "how": how}


def warm_up(engine, prompt, settings: SamplingSettings, drafter=None, prefills=None) -> None:
    """One short untimed run of each path, so first-call costs stay out of the figures."""
    run_mlx_lm(engine, prompt, settings, 8)
    run_ours(engine, prompt, settings, 8, mtp=False, prefills=prefills)
    run_ours(engine, prompt, settings, 8, drafter=drafter, draft_tokens=6, prefills=prefills)


class ControlledDrafter(Drafter):
    """The real drafter runs (its cost is real) but its guesses are replaced by the target's
    known continuation, in which each position is predictable with probability `acceptance`
    (drawn once per position from `seed`): a guess for a predictable position is the reference
    token, for another a wrong one. Like real text, what is predictable is a property of the
    positions, the same for every draft length, so that runs with different lengths face the
    same text (a draw per guess would give each length its own luck). With inner=None no
    drafter runs: the guesses cost nothing, as prompt lookup's do when the text is a copy. It
    reads the position only, so it is drafted ahead as the MTP drafter is."""

    drafts_ahead = True

    def __init__(self, inner, reference, vocab_size, acceptance, seed=0):
        self.inner, self.reference, self.vocab_size = inner, list(reference), vocab_size
        self.acceptance = acceptance
        self.predictable = mx.array(np.random.default_rng(seed).random(len(self.reference)) < acceptance)
        self._reference = mx.array(self.reference, mx.int32)

    def draft(self, context: DraftContext, g: int) -> Draft:
        return run_through(self.draft_steps(context, g))

    def draft_steps(self, context: DraftContext, g: int):
        """As the inner drafter works: a step per piece (see mlx_spec/drafting/pieces.py). The
        guesses are read from the reference on the device, at a position the running cycle may
        still be computing (a cycle drafted ahead)."""
        guesses = self._guesses(context.device_position, g)
        if self.inner is None:
            return Draft(guesses, source="copy", copied=True)
        drafted = yield from self.inner.draft_steps(context, g)
        # Tie the guesses to the drafter's output so that its work stays in the cycle's graph.
        return Draft(mx.where(drafted.tokens >= 0, guesses, guesses), source="controlled", steps=drafted.steps)

    @property
    def batch_group(self):
        """In a batch, the inner assistant's steps run once for every row that drafts with it
        (mlx_spec/drafting/rows.py), as the real drafter's do, so that a batch with controlled
        guesses pays what the real one pays; each row's guesses then come from its own reference
        (`from_batch`). None: no assistant inside, the guesses are drafted row by row."""
        return getattr(self.inner, "batch_group", None)

    def from_batch(self, drafted: mx.array, context: DraftContext) -> Draft:
        """This row's draft from its share of the batch's assistant guesses ([g])."""
        guesses = self._guesses(context.device_position, drafted.shape[0])
        return Draft(mx.where(drafted >= 0, guesses, guesses), source="controlled")

    def _guesses(self, position: mx.array, g: int) -> mx.array:
        if g == 0:
            return mx.zeros((0,), mx.int32)
        size = self._reference.size
        where = mx.minimum(position + 1 + mx.arange(g), size - 1)
        right = mx.take(self._reference, where)
        keep = mx.take(self.predictable, where) & (position + 1 + mx.arange(g) < size)
        return mx.where(keep, right, (right + 1) % self.vocab_size).astype(mx.int32)


def cost_ratios(engine, prompt, draft_lengths, repeats=5, prefills=None):
    """R_g = time(pass over g + 1 positions) / time(1 position) and C_g = time(g draft steps) /
    time(1 position), measured on the workload's own context. Each ratio is the median over
    `repeats` of a pass over one position and the other timed right after it: on a shared
    machine the speed drifts between measurements taken apart. Returns (one position's median
    ms, {g: {"R", "C"}})."""
    with prompt_sequence(engine, engine.decoder(mtp=False), prompt, prefills=prefills) as state:
        return _cost_ratios(engine, state, prompt, draft_lengths, repeats)


def _cost_ratios(engine, state, prompt, draft_lengths, repeats):
    from .common import median_ms
    from .one_row import as_row

    with as_row(engine.target, state) as row:

        def target(n):
            tokens = mx.array([prompt[-n:]])

            def run():
                mx.eval(row.pass_(tokens))
                row.cut(n)

            return run

        def drafting(g):
            return lambda: mx.eval(row.draft(engine.mtp_drafter, g))

        return _paired_ratios(target, drafting if engine.mtp_drafter is not None else None, draft_lengths, repeats, median_ms)


def _paired_ratios(target, drafting, draft_lengths, repeats, median_ms):
    one, ones, ratios = target(1), [], {}
    for g in draft_lengths:
        parts = {"R": target(g + 1)}
        if g and drafting is not None:
            parts["C"] = drafting(g)
        for part in (one, *parts.values()):
            part(), part()  # warm up: a first call may trace
        paired = {name: [] for name in parts}
        for _ in range(repeats):
            base = median_ms(one, 1, warmup=0)
            ones.append(base)
            for name, part in parts.items():
                paired[name].append(median_ms(part, 1, warmup=0) / base)
        ratios[g] = {"R": statistics.median(paired["R"]), "C": statistics.median(paired["C"]) if "C" in paired else 0.0}
    return statistics.median(ones), ratios


def expected_tokens(acceptance: float, g: int) -> float:
    """Tokens per cycle when each guess is kept with probability `acceptance`, until the first miss."""
    return float(sum(acceptance**i for i in range(g + 1)))


def device_ms(engine, state: SequenceState, drafter, g: int, repeats: int = 5) -> float:
    """The device time of one step of the loop on `state`'s context, measured alone: the step's
    graph is built first, then only its evaluation is timed (the caches are cut back after each)."""
    from .common import median_ms

    times = []
    from .one_row import one_row

    with one_row(engine.target, state, SAMPLING["greedy"], drafter, g) as build:
        for _ in range(repeats + 2):
            step = build()
            times.append(median_ms(lambda: mx.eval(step.arrays()), 1, warmup=0))
            build.settled()
    return sorted(times[2:])[len(times[2:]) // 2]


def loop_efficiency(engine, prompt, run: dict, drafter, repeats: int = 3, prefills=None) -> float:
    """The device time of a run's cycles, each measured alone for its g (`device_ms`), over the
    run's wall time: 1.0 when the device never waits for the host."""
    with prompt_sequence(engine, engine.decoder(mtp=False), prompt, prefills=prefills) as state:
        alone = sum(n * device_ms(engine, state, drafter if g else None, g, repeats)
                    for g, n in run["cycles_by_g"].items())
    return alone / (run["ms_per_cycle"] * run["cycles"]) if run["cycles"] else 0.0


def agreement(ours, theirs) -> str:
    """'yes' / 'no', over the common length when the runs stopped at different lengths (one
    stopped at a token the other does not stop at), and saying so."""
    n = min(len(ours), len(theirs))
    same = "yes" if ours[:n] == theirs[:n] else "no"
    return same if len(ours) == len(theirs) else f"{same} (first {n})"


def first_difference(engine, prompt, a, b):
    """Where two greedy outputs part: (index, logit of a's token - logit of b's token there, as
    one target pass over the common prefix computes them), or None when one extends the other."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if n is None:
        return None
    state = SequenceState(engine.target)
    engine.decoder(mtp=False).add_tokens(state, prompt + a[:n])
    logits, _ = engine.target.forward(mx.array([[state.tokens[-1]]]), state.cache)
    logits = logits[0, -1].astype(mx.float32)
    return n, (logits[a[n]] - logits[b[n]]).item()
