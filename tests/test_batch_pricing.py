"""What drafting costs a busy batch (issue: batch cost): a step's time is paid by every row of
the batch, so a row's guesses and a probe's are charged what they add to the whole step.

The engine's cost model (decoding/draft_lengths.py) is driven here with the step times of a
batch of 8 on this project's CPU, roughly, and guesses that are never kept, as a random drafter's
are: the regime where drafting must cost the batch next to nothing."""

import numpy as np
import pytest

import tiny

from mlx_spec.decoding.draft_lengths import Ask, DraftLengths
from mlx_spec.decoding.policy import PROBE_OVERHEAD, DraftLength
from mlx_spec.options import Options
from test_adaptive import cpu_cost, engine_after

ROWS = 8
STEP_MS = {1: 10.0, 2: 17.0, 3: 24.0, 4: 31.0, 7: 52.0}  # a batch of 8 over 1..7 positions, roughly


def never_kept_engine() -> DraftLengths:
    """An engine whose assistant's guesses were judged often and all but never kept (its pooled
    figures say so: a hair above nothing), with the batch's step times measured."""
    lengths = engine_after(0.0, cpu_cost)
    lengths.acceptance.observe(1, 1)  # one guess of thousands kept (the real run's 1 of 2,718): figures a hair above 0
    for _ in range(500):
        lengths.acceptance.observe(1, 0)
    for positions, ms in STEP_MS.items():
        for _ in range(3):
            lengths.observe(ROWS, positions, ms / 1000)
    return lengths


def run_batch(lengths, steps: int, join_every: int = 10, acceptance: float = 0.02):
    """Rows joining one every `join_every` steps up to 8, each step chosen and settled with each
    guess kept at `acceptance` (a random drafter's, right now and then). Yields (step, policies, gs, probing) for every step: `probing[i]` says whether
    row i's g is a probe (handed out as one, or one the free drafters alone make)."""
    rows, rng = [], np.random.default_rng(1)
    for step in range(steps):
        if step % join_every == 0 and len(rows) < ROWS:
            rows.append(DraftLength(prior=lengths.acceptance))
        asks = [Ask(p, 100) for p in rows] + [Ask(None, 0)] * (ROWS - len(rows))  # the storage's rows
        gs = lengths.choose(asks)[: len(rows)]
        probing = [p.probe_out or p.free_only for p in rows]
        yield step, rows, gs, probing
        for policy, g in zip(rows, gs):
            # A free probe's lookup finds nothing in text that does not repeat: it drafts none.
            g = 0 if policy.free_only else g
            policy.observe(g, next((i for i in range(g) if rng.random() >= acceptance), g), asked=gs[rows.index(policy)])


def test_no_row_drafts_beside_a_probe_for_nothing():
    """Where next to nothing is kept, the only steps with guesses are probes: a row whose guesses would
    add next to nothing never drafts in a step a probe widens (it used to draft as many as the
    probe, and one more to time that length, in a step priced as the probe's alone: every row of
    the batch paid the wider step). Each new row's first probe is prompt lookup's alone, and the
    others do not count on its width."""
    lengths = never_kept_engine()
    free_probes = 0
    for step, rows, gs, probing in run_batch(lengths, 400):
        for i, (policy, g) in enumerate(zip(rows, gs)):
            assert g == 0 or probing[i], (step, i, gs, probing)
        free_probes += sum(p.free_only and g > 0 for p, g in zip(rows, gs))
    assert free_probes == ROWS  # every row's first probe, lookup's alone


def test_the_batch_pays_for_its_probes_about_what_one_request_does():
    """A probe step is paid by the whole batch: the rows' periodic probes go out together, so the
    batch spends about PROBE_OVERHEAD of its time on them, not that much per row (eight rows
    probing apart would spend eight times as much). Measured at the modelled step times over
    2,000 steps after the rows joined."""
    lengths = never_kept_engine()
    plain, extra, probe_steps = 0.0, 0.0, 0
    for step, rows, gs, probing in run_batch(lengths, 2100):
        if step < 100:
            continue  # the rows joining, with their free first probes
        drafted = [g for p, g in zip(rows, gs) if not p.free_only]
        width = max(drafted, default=0) + 1
        plain += STEP_MS[1]
        extra += lengths.step_times(ROWS, [width])[0] * 1000 - STEP_MS[1]
        probe_steps += width > 1
    assert probe_steps > 0  # the rows still probe
    assert extra / plain < 2.5 * PROBE_OVERHEAD, (extra / plain, probe_steps)


def test_rows_that_gain_still_draft_beside_a_probe():
    """The rule charges guesses that add next to nothing: a row whose guesses are kept drafts
    beside another row's probe as it would without it."""
    lengths = never_kept_engine()
    good = DraftLength(prior=lengths.acceptance)
    good.skip_first_probe()
    rng = np.random.default_rng(0)
    for _ in range(40):  # its own guesses kept 90% of the time
        g = 4
        kept = next((i for i in range(g) if rng.random() > 0.9), g)
        good.observe(g, kept)
    probing = DraftLength(prior=lengths.acceptance)
    probing.skip_first_probe()
    probing.plain_streak = 10_000  # its periodic probe is due
    gs = lengths.choose([Ask(good, 100), Ask(probing, 100)] + [Ask(None, 0)] * (ROWS - 2))
    assert gs[1] == probing.probe_g and gs[0] >= 1, gs


@pytest.mark.parametrize("acceptance", [0.0, 0.5, 1.0])
def test_controlled_guesses_in_a_batch_share_the_assistant_s_steps(engine, monkeypatch, acceptance):
    """`bench batch --acceptance`: each request's guesses are its own reference's, kept at the
    set acceptance, while the assistant runs once a step for every row, as the real drafter does
    in a batch (a row drafting alone would price a batch's drafts at B times their cost). Every
    answer is MTP off's; at 1 every guess is kept, at 0 none, between some."""
    from mlx_spec.bench.runs import ControlledDrafter
    from mlx_spec.drafting.mtp import MTPDrafter

    rng = np.random.default_rng(3)
    prompts = [rng.integers(5, tiny.VOCAB, int(n)).tolist() for n in (12, 30, 21, 40)]
    off = engine.generate_many(prompts, max_tokens=24, mtp=False)
    calls = {"together": 0, "row by row": 0}
    batched, by_row = MTPDrafter.draft_batch_steps, MTPDrafter.draft_steps

    def together(self, *args):
        calls["together"] += 1
        return (yield from batched(self, *args))

    def row_by_row(self, *args):
        calls["row by row"] += 1
        return (yield from by_row(self, *args))

    monkeypatch.setattr(MTPDrafter, "draft_batch_steps", together)
    monkeypatch.setattr(MTPDrafter, "draft_steps", row_by_row)
    options = [Options(max_tokens=24, draft_tokens=3, drafter=ControlledDrafter(
        engine.mtp_drafter, prompt + answer.tokens, tiny.VOCAB, acceptance, seed=i))
        for i, (prompt, answer) in enumerate(zip(prompts, off))]
    results = engine.generate_many(prompts, options)
    assert [r.tokens for r in results] == [r.tokens for r in off]
    drafted, kept = sum(r.stats.drafted for r in results), sum(r.stats.kept for r in results)
    assert drafted > 0 and calls["together"] > 0
    assert calls["row by row"] <= len(prompts)  # each row's first cycle, alone before it joins
    if acceptance == 1.0:
        assert kept == drafted
    elif acceptance == 0.0:
        assert kept == 0
    else:
        assert 0 < kept < drafted


def test_a_size_timed_plain_only_is_priced_by_what_a_position_adds_at_its_rows():
    """A batch size whose steps were timed plain only borrows how a step grows with its positions
    from the sizes that have lines. On a compute-bound device a position costs each row's work,
    so a size of fewer rows (more of its step fixed cost) has a flatter shape: borrowed alone it
    put 6 rows' 3 positions at 42 ms where they took 57 (issue: batch cost). With two sizes'
    lines or more, what a position adds at this size is read off a line through their slopes."""
    from mlx_spec.decoding.step_lines import line

    def cpu(rows, positions):  # a fixed cost, a plain position per row, a guess per row
        return 0.005 + 0.002 * rows + 0.003 * rows * (positions - 1)

    seconds = {(b, p): cpu(b, p) for b in (1, 2, 8) for p in (1, 3, 7)}
    seconds[(4, 1)], seconds[(6, 1)] = cpu(4, 1), cpu(6, 1)
    for positions in (2, 3, 7):
        assert line(seconds, 4)(positions) == pytest.approx(cpu(4, positions), rel=0.01)
        # (Beside 8 rows, whose shape is steeper, the dearer of the two: under a tenth dear.)
        assert cpu(6, positions) <= line(seconds, 6)(positions) <= 1.1 * cpu(6, positions)
    # The nearest size's shape alone (2 rows for 4), as before: a sixth too cheap.
    nearest = {k: t for k, t in seconds.items() if k[0] in (2, 4)}
    assert line(nearest, 4)(3) == pytest.approx(cpu(4, 1) * cpu(2, 3) / cpu(2, 1))
    assert line(nearest, 4)(3) < 0.85 * cpu(4, 3)
    # Never below that shape: where the sizes' slopes say less (a device whose rows come nearly
    # free), the nearer size's own shape still holds.
    flat = {(1, 1): 0.010, (1, 7): 0.016, (2, 1): 0.010, (2, 7): 0.0161, (8, 1): 0.012, (8, 7): 0.014, (4, 1): 0.011}
    assert line(flat, 4)(7) == pytest.approx(0.011 * 0.0161 / 0.010)


def test_a_batch_tries_only_neighbours_the_line_puts_near_the_choice():
    """Next to the chosen length, an untimed neighbour is tried to time it. A batch's step is
    seldom timed (rows join, leave and probe around it), so there a try is paid by every row
    and mostly times nothing: a batch tries only a neighbour the line puts within
    EXPLORE_MARGIN of the choice. A request alone still tries it."""
    from mlx_spec.decoding.batch_margins import EXPLORE_MARGIN
    from test_adaptive import engine_after

    lengths = DraftLengths()
    lengths.acceptance = engine_after(0.5, lambda g: 1.0 + 0.4 * g).acceptance  # pooled: 0.5
    for rows in (1, ROWS):
        for positions, ms in ((1, 20.0), (2, 28.0)):
            for _ in range(3):
                lengths.observe(rows, positions, ms / 1000)
    # One guess: 1.5 tokens for 28 ms; two: 1.75 for the line's 36 ms, a tenth slower.
    assert 1.75 / 36 < (1 - EXPLORE_MARGIN) * 1.5 / 28
    batch = [DraftLength(prior=lengths.acceptance) for _ in range(ROWS)]
    assert lengths.choose([Ask(p, 100) for p in batch]) == [1] * ROWS
    assert (ROWS, 3) not in lengths.explored
    alone = DraftLength(prior=lengths.acceptance)
    assert lengths.choose([Ask(alone, 100)]) == [2] and lengths.explored[(1, 3)] == 1


def test_a_batch_drafts_only_where_drafting_clearly_beats_plain_steps():
    """Near break-even the choice turns on the noise in the step times, and a batch pays a
    wrong draft in every row: a batch of several rows drafts only where the line expects
    BATCH_MARGIN over plain steps; a request alone drafts for any gain."""
    from mlx_spec.decoding.batch_margins import BATCH_MARGIN
    from test_adaptive import engine_after

    lengths = DraftLengths()
    lengths.acceptance = engine_after(0.5, lambda g: 1.0 + 0.4 * g).acceptance  # pooled: 0.5
    # One guess: 1.5 tokens for 29 ms against one for 20: 3% more tokens per second.
    for rows in (1, ROWS):
        for positions, ms in ((1, 20.0), (2, 29.0), (3, 40.0)):
            for _ in range(3):
                lengths.observe(rows, positions, ms / 1000)
    assert 1.0 / 20 < 1.5 / 29 < (1 + BATCH_MARGIN) / 20
    assert lengths.choose([Ask(DraftLength(prior=lengths.acceptance), 100) for _ in range(ROWS)]) == [0] * ROWS
    assert lengths.choose([Ask(DraftLength(prior=lengths.acceptance), 100)]) == [1]
    # Where drafting clearly pays, the batch drafts.
    for _ in range(6):
        lengths.observe(ROWS, 2, 0.025)
    assert lengths.choose([Ask(DraftLength(prior=lengths.acceptance), 100) for _ in range(ROWS)]) == [1] * ROWS
