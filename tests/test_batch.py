"""Several conversations decoding together are each exactly what they are alone: random mixes of
prompts, settings, budgets, stop tokens and strings, arrivals and cancellations, token for token
against each request's solo answer; ragged acceptance (every row its own number of kept guesses
in the same step); sampling's distribution for a row inside a busy batch; and mlx-lm's own
BatchGenerator, which batches without drafts, as a second oracle."""

import dataclasses
import random

import numpy as np
import pytest

import tiny
from scripted import modelled_step_times
from mlx_spec.decoding.prompt_cache import PromptCache
from mlx_spec.decoding.reports import WAITING
from mlx_spec.models.cache import FullCache
from mlx_spec.generation import Generation
from mlx_spec.options import Options
from mlx_spec.sampling.settings import SamplingSettings
from mlx_spec.together import Together
from scripted import ScriptedDrafter
from test_sampling import ALPHA, chi_square_p, exact_first_two

SAMPLED = [dict(temperature=0.8, seed=3), dict(temperature=1.0, top_k=20, seed=5),
           dict(temperature=0.7, top_p=0.9, seed=11), dict(temperature=1.2, top_k=50, top_p=0.95, seed=2)]


def random_request(rng: random.Random):
    """A prompt and options as agents send them: any length (one token, past the sliding window
    of 12, past the full-attention buffer's first 512 slots), any settings and budget."""
    length = rng.choice([1, 3, 11, 13, 40, 140, 300, 470])
    prompt = [rng.randrange(5, tiny.VOCAB) for _ in range(length)]
    if rng.random() < 0.25:  # a prompt that repeats itself: prompt lookup guesses
        prompt = (prompt[:9] or [7]) * 4
    settings = dict(max_tokens=rng.choice([1, 2, 9, 30, 64, 90]))
    kind = rng.choice(["greedy", "sampled", "off", "fixed", "no-lookup"])
    if kind == "sampled":
        settings.update(rng.choice(SAMPLED))
    elif kind == "off":
        settings.update(mtp=False)
    elif kind == "fixed":
        settings.update(draft_tokens=rng.randrange(0, 7))
    elif kind == "no-lookup":
        settings.update(lookup=False)
    if rng.random() < 0.2:
        settings.update(stop=("e",))  # a stop string, on the text
    return prompt, Options(**settings)


def figures(report):
    return dataclasses.replace(report, drafted=False, cycle=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_mixes_give_every_request_its_solo_answer(engine, seed):
    rng = random.Random(seed)
    requests = [random_request(rng) for _ in range(7)]
    # A stop token the random model does produce, so that some rows end early.
    stopping = engine.with_stop_tokens([engine.generate(requests[0][0], max_tokens=8, mtp=False).tokens[-1]])
    for e in (engine, stopping):
        alone = [e.generate(p, o) for p, o in requests]
        together = e.generate_many([p for p, _ in requests], [o for _, o in requests])
        for (prompt, options), solo, batched in zip(requests, alone, together):
            assert batched.tokens == solo.tokens, (len(prompt), options)
            assert batched.text == solo.text and batched.finish_reason == solo.finish_reason
            # Every figure of every token, bit for bit: a row's pass reads its own keys in the
            # order its pass alone reads them (test_compiled.py). (Which tokens were kept guesses,
            # and in which cycle, depend on the draft lengths chosen.)
            assert [figures(s) for s in batched.steps] == [figures(s) for s in solo.steps]


def test_rows_keep_each_their_own_number_of_guesses_in_the_same_step(engine):
    """Six rows with scripted drafters: one keeps every guess, one none, the others exactly
    1, 2, 3 and 5 of 6, every step; each gives its solo tokens and keeps what it keeps alone."""
    prompt = list(range(20, 20 + 2 * tiny.WINDOW + 3))
    breaks = [None, 0, 1, 2, 3, 5]
    prompts = [prompt[i:] for i in range(len(breaks))]
    solo = [engine.generate(p, max_tokens=60, mtp=False).tokens for p in prompts]
    options = [Options(max_tokens=60, draft_tokens=6,
                       drafter=ScriptedDrafter(p + s, tiny.VOCAB, break_at=j)) for p, s, j in zip(prompts, solo, breaks)]
    results = engine.generate_many(prompts, options)
    for result, expected, j in zip(results, solo, breaks):
        assert result.tokens == expected
        kept_per_cycle = 6 if j is None else j
        full = [c for c in range(result.stats.cycles)]  # every cycle but the budget's last is whole
        assert result.stats.kept >= kept_per_cycle * (len(full) - 1)
        assert result.stats.kept_by_position[kept_per_cycle:] == [0] * (len(result.stats.kept_by_position) - kept_per_cycle)


def test_a_row_that_keeps_nothing_drafts_none_beside_rows_that_keep_everything(engine, monkeypatch):
    """Adaptive rows choose their lengths from one cost model with each row's own acceptance: a
    row whose guesses are never kept drafts none beside rows whose guesses all are, which draft
    long (a step's cost modelled, so that the choice does not hang on this machine's speed)."""
    from mlx_spec.decoding.draft_lengths import DraftLengths

    modelled_step_times(monkeypatch)
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())  # only modelled times in it
    prompt = list(range(20, 20 + 2 * tiny.WINDOW + 3))
    prompts = [prompt, prompt[1:], prompt[2:]]
    solo = [engine.generate(p, max_tokens=150, mtp=False).tokens for p in prompts]
    options = [Options(max_tokens=150, drafter=ScriptedDrafter(p + s, tiny.VOCAB, break_at=j))
               for p, s, j in zip(prompts, solo, [None, None, 0])]
    results = engine.generate_many(prompts, options)
    assert [r.tokens for r in results] == solo
    keeps, keeps_too, never = (r.stats for r in results)
    assert keeps.mean_g > 5 and keeps_too.mean_g > 5
    # (It starts from the engine's acceptance, which the other rows make high: a few cycles
    # of drafting before its own misses take over.)
    assert never.kept == 0 and never.cycles_by_g.get(0, 0) > 0.75 * never.cycles


def test_the_cost_model_is_the_engine_s_learnt_once(checkpoints):
    """Every generation on an engine, alone or batched, times its steps into the engine's one
    table of step costs (rows x positions): a second request starts from what the first learnt."""
    from mlx_spec import load

    fresh = load(str(checkpoints["text"]), str(checkpoints["assistant"])).with_stop_tokens([])
    fresh.generate(list(range(30, 60)), max_tokens=40, draft_tokens=3)
    alone = dict(fresh.draft_lengths.seconds)
    assert (1, 4) in alone
    fresh.generate_many([list(range(30, 60)), list(range(40, 90))], max_tokens=30, mtp=False)
    assert set(alone) < set(fresh.draft_lengths.seconds) and (2, 1) in fresh.draft_lengths.seconds


def test_a_sampled_row_in_a_busy_batch_follows_the_target(engine):
    """480 seeded rows of one token each, sixteen at a time beside two long greedy rows: their
    first tokens follow the target's own distribution (chi-square at ALPHA)."""
    settings = dict(temperature=1.0, top_k=64, top_p=0.95)
    prompt = list(range(30, 30 + 2 * tiny.WINDOW))
    p0, _ = exact_first_two(engine, prompt, SamplingSettings(**settings))
    busy = [list(range(100, 140)), list(range(200, 300))]
    firsts = []
    for start in range(0, 480, 16):
        prompts = busy + [prompt] * 16
        options = [Options(max_tokens=12)] * 2 + [Options(max_tokens=1, seed=s, **settings) for s in range(start, start + 16)]
        firsts += [r.tokens[0] for r in engine.generate_many(prompts, options)[2:]]
    assert chi_square_p(np.bincount(firsts, minlength=tiny.VOCAB), p0) > ALPHA


def test_greedy_rows_equal_mlx_lm_batch_generator(engine):
    """mlx-lm's own batched decoding (BatchGenerator, no drafts) on the same model and prompts
    gives the tokens our batch gives with drafting on."""
    from mlx_lm.generate import BatchGenerator

    rng = np.random.RandomState(0)
    prompts = [rng.randint(5, tiny.VOCAB, size=n).tolist() for n in (7, 40, 100, 300)]
    generator = BatchGenerator(engine.target.model, max_tokens=60, stop_tokens=[])
    uids = generator.insert(prompts, [60] * len(prompts))
    theirs = {uid: [] for uid in uids}
    while responses := generator.next_generated():
        for response in responses:
            theirs[response.uid].append(response.token)
    generator.close()
    ours = engine.generate_many(prompts, max_tokens=60)
    assert [r.tokens for r in ours] == [theirs[uid] for uid in uids]


class Client:
    """A request driven through `Together` as the server drives it: it arrives at a turn, may
    leave during its prompt (after `leave_in_prompt` chunks) or after `leave_after` tokens."""

    def __init__(self, engine, prompt, options, cache, leave_in_prompt=None, leave_after=None):
        self.engine, self.prompt, self.options, self.cache = engine, prompt, options, cache
        self.leave_in_prompt, self.leave_after = leave_in_prompt, leave_after
        self.tokens, self.chunks, self.error = [], 0, None

    def make(self, together):
        def events(between_chunks):
            def stop():
                self.chunks += 1
                return self.leave_in_prompt is not None and self.chunks > self.leave_in_prompt or between_chunks()

            return iter(Generation(self.engine, self.prompt, self.options, cache=self.cache, stop=stop, batch=together.batch))

        return events

    def emit(self, event):
        if isinstance(event, BaseException):
            self.error = event
        else:
            self.tokens.append(event.token)

    def stopped(self):
        return self.leave_after is not None and len(self.tokens) >= self.leave_after


def test_arrivals_and_departures_mid_prompt_and_mid_answer(engine):
    """Requests arrive while others decode; a long prompt goes in by chunks with the others
    stepping between them; one client leaves during its prompt, one during its answer. Every
    answer is its solo one (a prefix of it for the one that left), and the prompt cache holds
    every sequence consistent: sent again, each resumes its cached prefix and gives its solo
    answer."""
    rng = random.Random(7)
    long_prompt = [rng.randrange(5, tiny.VOCAB) for _ in range(1300)]  # three chunks of 512
    prompts = [[rng.randrange(5, tiny.VOCAB) for _ in range(n)] for n in (30, 200, 15)] + [long_prompt, long_prompt[7:]]
    options = [Options(max_tokens=80), Options(max_tokens=50, temperature=0.9, seed=4), Options(max_tokens=40, mtp=False),
               Options(max_tokens=30), Options(max_tokens=30)]
    solo = [engine.generate(p, o).tokens for p, o in zip(prompts, options)]
    cache = PromptCache(engine.target, 10**9)
    clients = [Client(engine, p, o, cache) for p, o in zip(prompts, options)]
    clients[1].leave_after = 12  # leaves mid-answer
    clients[4].leave_in_prompt = 1  # leaves after two of its prompt's chunks went through
    together = Together(engine)
    arrivals = {0: [0, 1], 3: [2], 5: [3], 9: [4]}
    turn, seen_before_long = 0, None
    while turn <= max(arrivals) or together.busy:
        for i in arrivals.get(turn, []):
            together.add(clients[i].make(together), clients[i].emit, clients[i].stopped)
            if i == 3:
                seen_before_long = len(clients[0].tokens)
        together.turn()
        if turn == 5:  # the long prompt went in during this turn: the others stepped meanwhile
            assert len(clients[0].tokens) >= seen_before_long + 2
        turn += 1
    for i, client in enumerate(clients):
        assert client.error is None
        expected = solo[i][: len(client.tokens)] if i in (1, 4) else solo[i]
        assert client.tokens == expected, i
    assert clients[4].tokens == [] and len(clients[1].tokens) == 12
    for i, prompt in enumerate(prompts):  # each conversation goes on: its next turn
        follow = prompt + solo[i] + [5, 6]
        again = engine.generate(follow, max_tokens=5, cache=cache)
        assert again.tokens == engine.generate(follow, max_tokens=5).tokens
        held = 1024 + 1 if i == 4 else len(prompt) + len(clients[i].tokens)
        assert again.stats.prompt_reused >= held - 1, i


def test_the_batch_s_k_v_narrows_when_its_widest_row_leaves(engine):
    """A short conversation beside a long one: once the long one left, the short row kept the
    buffers as wide as the long one's, and went back to the prompt cache holding them all
    (found by a review; admission counts the rows' own lengths). The buffers narrow to what the
    rows left need, and each sequence goes back as wide as its own K/V. Answers stay solo."""
    rng = random.Random(3)
    prompts = [[rng.randrange(5, tiny.VOCAB) for _ in range(n)] for n in (1300, 40)]
    options = [Options(max_tokens=3), Options(max_tokens=60)]
    solo = [engine.generate(p, o).tokens for p, o in zip(prompts, options)]
    cache = PromptCache(engine.target, 10**9)
    clients = [Client(engine, p, o, cache) for p, o in zip(prompts, options)]
    together = Together(engine)
    for client in clients:
        together.add(client.make(together), client.emit, client.stopped)
    widths = []
    while together.busy:
        together.turn()
        rows = together.batch.caches
        widths.append((len(rows), rows.capacity if len(rows) else 0))
    assert [c.tokens for c in clients] == solo
    assert max(width for rows, width in widths if rows == 2) > 1300
    assert max(width for rows, width in widths[widths.index(max(widths)) :] if rows == 1) <= 512
    short = cache.take(prompts[1] + solo[1], [])[0]
    full = [c for c in short.cache if isinstance(c, FullCache)]
    assert full and all(c.keys.shape[2] <= 512 for c in full)


def test_a_reader_that_leaves_early_leaves_every_sequence_consistent(engine):
    """stream_many closed after a few tokens: each request's sequence went back to the prompt
    cache holding exactly what was handed over, and resumes to its solo answer."""
    prompts = [list(range(10, 10 + n)) for n in (20, 45, 90)]
    solo = [engine.generate(p, max_tokens=40).tokens for p in prompts]
    cache = PromptCache(engine.target, 10**9)
    stream = engine.stream_many(prompts, max_tokens=40, cache=cache)
    got = {i: [] for i in range(3)}
    for i, report in stream:
        got[i].append(report.token)
        if sum(map(len, got.values())) >= 25:
            break
    stream_iter = iter(stream)
    stream_iter.close()
    for i, prompt in enumerate(prompts):
        assert got[i] == solo[i][: len(got[i])]
        assert engine.generate(prompt, max_tokens=40, cache=cache).tokens == solo[i]


def test_a_short_sequence_that_leaves_with_tokens_untaken_goes_back_consistent(engine):
    """Prompts shorter than a sliding window, left after three tokens with more settled and not
    taken: the untaken tokens go back (found by a review: a sequence holding its whole history
    came out of the batch unable to trim), and each conversation resumes to its solo answer."""
    cache = PromptCache(engine.target, 10**9)
    prompts = [[2, 105, 77], [2, 105, 78, 9]]
    solo = [engine.generate(p, max_tokens=12, draft_tokens=4).tokens for p in prompts]
    stream = iter(engine.stream_many(prompts, Options(max_tokens=12, draft_tokens=4), cache=cache))
    got = [next(stream) for _ in range(3)]
    stream.close()
    for i, prompt in enumerate(prompts):
        taken = [report.token for j, report in got if j == i]
        assert taken == solo[i][: len(taken)]
        follow = prompt + solo[i] + [5]
        assert engine.generate(follow, max_tokens=4, cache=cache).tokens == engine.generate(follow, max_tokens=4).tokens


def test_bad_requests_in_a_batch_are_refused_by_name(engine):
    with pytest.raises(Exception, match="options for"):
        engine.generate_many([[5, 6], [7, 8]], [Options(), Options(), Options()])
    with pytest.raises(Exception, match="outside the vocabulary"):
        engine.generate_many([[5, 6], [tiny.VOCAB + 3]], max_tokens=4)


def test_waiting_is_what_a_batch_row_gives_before_the_next_step(engine):
    together = Together(engine)
    answer = Generation(engine, [5, 6, 7], Options(max_tokens=3), batch=together.batch)
    events = iter(answer)
    assert next(events) is WAITING  # its prompt is in, nothing decoded yet
    together.batch.step()
    assert next(events).token == engine.generate([5, 6, 7], max_tokens=3).tokens[0]
    events.close()
    assert together.batch.rows == []


def test_the_readme_s_example_of_several_prompts_runs(engine):
    """The README's lines for several prompts at once, run as written on the tiny engine."""
    from pathlib import Path

    import mlx_spec

    block = (Path(__file__).resolve().parents[1] / "README.md").read_text().split("## Python", 1)[1]
    block = block.split("```python", 1)[1].split("```", 1)[0]
    lines = block[block.index("# Several prompts at once"):]
    printed = []
    exec(lines, {"engine": engine, "mlx_spec": mlx_spec, "print": lambda *a: printed.append(a)})
    assert printed and {index for index, _ in printed} == {0, 1}


def test_a_row_whose_reader_has_not_read_sits_the_step_out(engine):
    """Two rows, only one read: the other sits the steps out (its last token goes through the
    pass at its offset and is cut, found while pipelining: the pass used to miss that row of the
    storage and end both rows). Read at last, each gives its solo tokens."""
    prompts = [list(range(10, 40)), list(range(50, 90))]
    solo = [engine.generate(p, max_tokens=20).tokens for p in prompts]
    together = Together(engine)
    a, b = (iter(Generation(engine, p, Options(max_tokens=20), batch=together.batch)) for p in prompts)
    assert next(a) is WAITING and next(b) is WAITING
    assert together.batch.step() > 0
    got_a, got_b = [], []
    waiting_b = []
    for _ in range(4):  # a is read and steps; b's reports wait, so b sits out
        while (event := next(a)) is not WAITING:
            got_a.append(event.token)
        assert together.batch.step() > 0
        waiting_b.append(len(together.batch.rows[1].ready))
    # b stepped in the step queued before its reports were left unread, then no more.
    assert waiting_b[1] == waiting_b[2] == waiting_b[3] > 0
    for events, got in ((a, got_a), (b, got_b)):
        for event in events:
            if event is WAITING:
                together.batch.step()
            else:
                got.append(event.token)
    assert [got_a, got_b] == solo


def test_a_reader_two_steps_behind_that_leaves_fails_no_one(engine):
    """A row that kept all 16 guesses in the two steps its reader left unread (34 tokens) sits
    out while the other row's passes write past them: leaving, it could not go back that far,
    and its trim failed every row of the batch (found by a review). It now takes back what its
    caches can give back, goes back to the prompt cache consistent (a follow-up resumes to the
    uncached answer), and the other row gives its solo tokens."""
    prompts = [list(range(10, 40)), list(range(50, 90))]
    solo = [engine.generate(p, max_tokens=120).tokens for p in prompts]
    cache, together = PromptCache(engine.target, 10**9), Together(engine)
    options = [Options(max_tokens=120, draft_tokens=g, drafter=ScriptedDrafter(p + s, tiny.VOCAB))
               for g, p, s in zip((8, 16), prompts, solo)]
    a, b = (iter(Generation(engine, p, o, batch=together.batch, cache=cache)) for p, o in zip(prompts, options))
    assert next(a) is WAITING and next(b) is WAITING
    got_a = []
    for _ in range(4):  # b is never read
        together.batch.step()
        while (event := next(a)) is not WAITING:
            got_a.append(event.token)
    assert len(together.batch.rows[1].ready) == 34
    b.close()
    for event in a:
        if event is WAITING:
            together.batch.step()
        else:
            got_a.append(event.token)
    assert got_a == solo[0]
    follow = prompts[1] + solo[1][:3] + [5]
    assert engine.generate(follow, max_tokens=6, cache=cache).tokens == engine.generate(follow, max_tokens=6).tokens


def test_a_first_cycle_built_into_a_step_that_is_dropped_leaves_no_position_behind(engine):
    """A one-token prompt joins while the only other row runs its last cycle: its first cycle
    (alone) is built, and the step is dropped, as no stored row has a budget left. Its caches
    went on one position ahead of its tokens for its whole stay (found by a review), a position
    of its trim allowance lost. Without drafts each step queued ahead writes one position."""
    together = Together(engine)
    a = iter(Generation(engine, list(range(10, 30)), Options(max_tokens=2, mtp=False), batch=together.batch))
    assert next(a) is WAITING
    together.batch.step()
    b = iter(Generation(engine, [5], Options(max_tokens=6, mtp=False), batch=together.batch))
    assert next(b) is WAITING
    got, ahead = [], []
    for _ in range(9):
        for events, tokens in ((a, []), (b, got)):
            tokens.extend(event.token for event in iter(lambda: next(events, WAITING), WAITING))
        ahead += [r.state.cached - (len(r.state.tokens) - 1) for r in together.batch.rows if r.state.in_batch]
        together.batch.step()
    assert got == engine.generate([5], max_tokens=6, mtp=False).tokens
    assert ahead and set(ahead) == {1}, ahead


def test_steps_are_built_ahead_and_give_the_tokens_built_after_each_sync(engine):
    """The pipelined batch builds each step while the one before it runs (rows count cycles
    built ahead) and gives the very tokens of a batch that builds every step after its sync."""
    from mlx_spec.decoding.batch import Batch

    prompts = [list(range(10, 10 + n)) for n in (20, 33, 47)]
    options = [Options(max_tokens=40), Options(max_tokens=30, temperature=0.9, seed=4), Options(max_tokens=25, mtp=False)]
    results = {}
    for pipelined in (True, False):
        together = Together(engine)
        together.batch = Batch(engine.target, engine.draft_lengths, pipelined=pipelined)
        runs = [Generation(engine, p, o, batch=together.batch) for p, o in zip(prompts, options)]
        streams, got = [iter(r) for r in runs], [[] for _ in runs]
        while together.batch.rows or any(s is not None for s in streams):
            for i, events in enumerate(streams):
                while events is not None and (event := next(events, None)) is not WAITING:
                    if event is None:
                        streams[i] = events = None
                    elif hasattr(event, "token"):
                        got[i].append(event.token)
            together.batch.step()
        results[pipelined] = (got, [r.decoder.stats.prebuilt for r in runs])
    assert results[True][0] == results[False][0] == [engine.generate(p, o).tokens for p, o in zip(prompts, options)]
    assert all(n > 0 for n in results[True][1]) and not any(results[False][1])


def test_a_row_whose_settling_raises_ends_alone_and_the_others_go_on(engine):
    """A row's own drafter raising while its synced cycle settles (`accept`, after the next step
    was queued): that row's reader raises it, its sequence holds exactly the tokens it handed
    over, and the other row gives its solo tokens (found by a review: the error left the step
    unsettled for every row, and reached the server's scheduler, which stopped serving)."""

    class FailsOnAccept(ScriptedDrafter):
        def accept(self, state, tokens):
            self.accepted = getattr(self, "accepted", 0) + 1
            if self.accepted == 3:
                raise RuntimeError("the drafter failed")

    prompts = [list(range(10, 40)), list(range(50, 90))]
    solo = [engine.generate(p, max_tokens=40).tokens for p in prompts]
    cache, together = PromptCache(engine.target, 10**9), Together(engine)
    options = [Options(max_tokens=40, draft_tokens=3, drafter=FailsOnAccept(prompts[0] + solo[0], tiny.VOCAB)),
               Options(max_tokens=40, draft_tokens=3, drafter=ScriptedDrafter(prompts[1] + solo[1], tiny.VOCAB, break_at=1))]
    readers = [iter(Generation(engine, p, o, batch=together.batch, cache=cache)) for p, o in zip(prompts, options)]
    got, errors, ended = [[], []], [], [False, False]
    while not all(ended):
        for i, reader in enumerate(readers):
            try:
                for event in reader:
                    if event is WAITING:
                        break
                    got[i].append(event.token)
                else:
                    ended[i] = True
            except RuntimeError as e:
                errors.append((i, str(e)))
                ended[i], readers[i] = True, iter(())
        together.batch.step()
    assert errors == [(0, "the drafter failed")]
    assert got[1] == solo[1]
    assert 0 < len(got[0]) < 40 and got[0] == solo[0][: len(got[0])]
    (kept,) = [s for s in cache.sequences if s.tokens[:30] == prompts[0]]
    assert kept.tokens == prompts[0] + got[0] and kept.cached == len(kept.tokens) - 1
    follow = prompts[0] + got[0] + [5]
    assert engine.generate(follow, max_tokens=6, cache=cache).tokens == engine.generate(follow, max_tokens=6).tokens
