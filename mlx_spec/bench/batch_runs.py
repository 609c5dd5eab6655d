"""The timed runs of `bench batch` (batch.py): mlx-spec's batch, mlx-lm's BatchGenerator and the
requests one after another, each with every request's token times; the requests and, for
`--acceptance`, their controlled drafters."""

import statistics
import time

import numpy as np

from ..decoding.limits import MAX_DRAFT_TOKENS
from ..options import Options
from .runs import ControlledDrafter


def requests(engine, n: int, prompt_range, answer_range, seed: int = 0):
    """n requests of mixed lengths: random prompts (as random weights have no text) and budgets."""
    rng = np.random.default_rng(seed)
    vocab = engine.target.vocab_size
    return [(rng.integers(5, vocab, int(rng.integers(*prompt_range))).tolist(), int(rng.integers(*answer_range)))
            for _ in range(n)]


def timed_ours(engine, batch, drafters=None, **settings) -> dict:
    """mlx-spec's batch over the requests, with per-request token times. `drafters`: each
    request's own (a controlled drafter: --acceptance), where it drafts; None: the default's."""
    prompts, options = [p for p, _ in batch], [Options(max_tokens=n, **settings, **own(drafters, i, settings))
                                               for i, (_, n) in enumerate(batch)]
    times = [[] for _ in batch]
    began = time.perf_counter()
    answers = engine.stream_many(prompts, options)
    for i, _ in answers:
        times[i].append(time.perf_counter())
    result = figures(began, times)
    result["tokens"] = [r.tokens for r in answers.results]
    result["drafted"] = sum(r.stats.drafted for r in answers.results)
    result["kept"] = sum(r.stats.kept for r in answers.results)
    return result


def timed_mlx_lm(engine, batch) -> dict:
    """mlx-lm's BatchGenerator (its server's batched path) over the same requests, greedy."""
    from mlx_lm.generate import BatchGenerator

    times = [[] for _ in batch]
    tokens = [[] for _ in batch]
    began = time.perf_counter()
    generator = BatchGenerator(engine.target.model, max_tokens=max(n for _, n in batch), stop_tokens=[])
    uids = generator.insert([p for p, _ in batch], [n for _, n in batch])
    row = {uid: i for i, uid in enumerate(uids)}
    while responses := generator.next_generated():
        for response in responses:
            times[row[response.uid]].append(time.perf_counter())
            tokens[row[response.uid]].append(response.token)
    generator.close()
    result = figures(began, times)
    result["tokens"] = tokens
    return result


def timed_one_after_another(engine, batch, drafters=None) -> dict:
    began = time.perf_counter()
    times, tokens = [], []
    for i, (prompt, n) in enumerate(batch):
        run, answer = [], []
        for report in engine.stream(prompt, max_tokens=n, **own(drafters, i, {})):
            run.append(time.perf_counter())
            answer.append(report.token)
        times.append(run)
        tokens.append(answer)
    result = figures(began, times)
    result["tokens"] = tokens
    return result


def figures(began: float, times) -> dict:
    """Total tok/s (every token over the wall time from the start), per-request tok/s (each
    request's tokens after its first arrival over the time from it to its last: a cycle's kept
    guesses arrive with its first token, and counting them would credit them no time), time to
    first token."""
    total = sum(len(t) for t in times)
    end = max(t[-1] for t in times if t)
    per = [sum(x > t[0] for x in t) / (t[-1] - t[0]) for t in times if len(t) > 1 and t[-1] > t[0]]
    return {"total_tps": total / (end - began), "per_request_tps": statistics.median(per) if per else 0.0,
            "first_token_s": statistics.median([t[0] - began for t in times if t]), "seconds": end - began,
            "generated": total}


def recorded(engine, steps, run):
    """run() with the engine's cost model recording every settled step into `steps` (None: not)."""
    engine.draft_lengths.trace = steps
    try:
        return run()
    finally:
        engine.draft_lengths.trace = None


def own(drafters, i: int, settings: dict) -> dict:
    """Request i's drafter as a setting, where it has one and drafts."""
    if drafters is None or settings.get("mtp") is False:
        return {}
    return {"drafter": drafters[i]}


def controlled_drafters(engine, batch, acceptance):
    """Each request's controlled drafter at `acceptance` (None: the real drafter, no list): its
    guesses are its own MTP off answer's tokens, each position predictable at that chance (its
    own seed), while the real assistant runs and is paid for, once a step for every row."""
    if acceptance is None:
        return None
    # Past each answer's end too: a step built ahead of the one running drafts for the budget it
    # may still have, and its guesses there are the reference's, not wrong ones.
    answers = engine.generate_many([p for p, _ in batch], [Options(max_tokens=n + MAX_DRAFT_TOKENS + 1, mtp=False)
                                                           for _, n in batch])
    return [ControlledDrafter(engine.mtp_drafter, prompt + answer.tokens, engine.target.vocab_size, acceptance, seed=i)
            for i, ((prompt, _), answer) in enumerate(zip(batch, answers))]
