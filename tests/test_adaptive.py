"""Adaptive draft length and prompt-lookup drafts: they change speed, never the output."""

import random
from contextlib import contextmanager

import numpy as np
import pytest

import tiny
from mlx_spec import load
from mlx_spec.decoding.draft_lengths import Ask, DraftLengths
from mlx_spec.decoding.policy import DraftLength
from scripted import ScriptedDrafter, modelled_step_times

LONG = 200


class Alone:
    """One request's draft length under an engine's cost model, as a generation alone uses
    them: each cycle a step of one row."""

    def __init__(self, lengths=None):
        self.policy, self.lengths = DraftLength(), lengths or DraftLengths()

    def choose(self, budget):
        return self.lengths.choose([Ask(self.policy, budget)])[0]

    def observe(self, g, kept, seconds, asked=None):
        self.policy.observe(g, kept, asked)
        self.lengths.observe(1, g + 1, seconds)

    def withdraw(self):
        self.policy.withdraw()

    def fastest(self, limit):
        return self.lengths.fastest(1, [(0, self.policy, limit)])

    def line(self, g):
        return self.lengths._line(1)(g + 1)

    def measured(self, g):
        return self.lengths.seconds.get((1, g + 1))

    def probe_every(self):
        return self.lengths._probe_every(self.policy, 1)


def drawn(rng, g: int, acceptance: float) -> int:
    """How many of g guesses a cycle keeps when each is kept with probability `acceptance`."""
    kept = 0
    while kept < g and rng.random() < acceptance:
        kept += 1
    return kept


def simulate(policy, acceptance, cycles=300, seed=0, step=1.0, per_guess=0.3, cost=None):
    """Feed the policy cycles whose guesses are kept with probability `acceptance` and whose
    cost is step * (1 + per_guess * g) seconds (or cost(g)); return how often each g was chosen."""
    rng = np.random.default_rng(seed)
    chosen = {}
    for _ in range(cycles):
        g = policy.choose(budget=100)
        chosen[g] = chosen.get(g, 0) + 1
        kept = drawn(rng, g, acceptance)
        policy.observe(g, kept, cost(g) if cost else step * (1 + per_guess * g))
    return chosen


def test_policy_stops_drafting_when_nothing_is_kept():
    chosen = simulate(Alone(), acceptance=0.0)
    assert chosen.get(0, 0) > 0.85 * sum(chosen.values())


def test_policy_drafts_long_when_everything_is_kept():
    chosen = simulate(Alone(), acceptance=1.0)
    assert chosen.get(8, 0) > 0.9 * sum(chosen.values())


def test_policy_measures_the_lengths_next_to_its_choice():
    """A pass whose cost jumps at 9 positions (as matmul kernels change with the rows; the
    small shape's 9-position pass on this project's CPU): the straight line through the lengths
    measured says g = 8 at a = 1, the lengths next to it are measured, and g = 7 wins."""
    chosen = simulate(Alone(), acceptance=1.0, cost=lambda g: 1 + 0.1 * g + (0.3 if g == 8 else 0))
    assert chosen.get(7, 0) > 0.9 * sum(chosen.values())
    # Where the line is right, the neighbours cost a few cycles and the choice stays.
    chosen = simulate(Alone(), acceptance=1.0, cost=lambda g: 1 + 0.1 * g)
    assert chosen.get(8, 0) > 0.95 * sum(chosen.values())


def test_a_neighbour_is_tried_a_bounded_number_of_times_while_untimed():
    """A length whose cycles are never timed (each traced) is not tried forever."""
    from mlx_spec.decoding.draft_lengths import EXPLORE_TRIES

    policy = Alone()
    chosen = []
    for _ in range(100):
        g = policy.choose(budget=100)
        chosen.append(g)
        policy.observe(g, g, None if g == 7 else 1 + 0.1 * g)
    assert chosen.count(7) == EXPLORE_TRIES and chosen[-1] == 8


def test_the_neighbours_steps_are_timed_in_a_real_run(engine, prompt, reference, monkeypatch):
    """A step is timed only between two steps of its shape (batch.py): a neighbouring length is
    tried for enough steps in a row that one of them is. With every guess kept, the loop drafts
    8 and times 7 beside it. The loop decides which steps are timed; their seconds are modelled
    (the choice must not hang on this machine's noise)."""
    modelled_step_times(monkeypatch, every_step=False)
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=0.0, seed=2)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter)
    assert result.tokens == reference[len(prompt) :]
    assert max(result.stats.cycles_by_g, key=result.stats.cycles_by_g.get) == 8
    assert {(1, 9), (1, 8)} <= set(engine.draft_lengths.seconds), engine.draft_lengths.table()


def run_on_an_old_table(engine, prompt, reference, monkeypatch, lengths, break_probability):
    """A request in the real loop (which decides which steps are timed) on `lengths`, a table
    a thousand steps old; its steps' seconds modelled (a step of L positions takes
    1 + 0.5 (L - 1)), its guesses scripted and seeded. Its tokens are the reference's."""
    lengths.steps = 1000
    modelled_step_times(monkeypatch, per_position=0.5, every_step=False)
    monkeypatch.setattr(engine, "draft_lengths", lengths)
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=break_probability, seed=2)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter)
    assert result.tokens == reference[len(prompt) :]
    return result


def test_a_stale_plain_step_is_timed_again_in_a_real_run(engine, prompt, reference, monkeypatch):
    """The loop decides which steps are timed (a step between two of its shape): the plain
    steps that time a plain step again run three in a row, so that one of them is. The table's
    plain step is a thousand steps old and 1.27 times its cost, so one guess (kept 3 times in
    10, at 1.5 plain steps) looks worth drafting; once the plain step is timed again, it is not,
    and the request runs plain (it drafted every cycle: the plain step was never timed again)."""
    lengths = DraftLengths()
    lengths.observe(1, 1, 1.27)
    lengths.observe(1, 2, 1.5)
    result = run_on_an_old_table(engine, prompt, reference, monkeypatch, lengths, break_probability=0.7)
    assert lengths.seconds[(1, 1)] == pytest.approx(1.0, abs=0.05), lengths.table()
    assert result.stats.cycles_by_g.get(0, 0) > 0.3 * result.stats.cycles, result.stats.cycles_by_g


def test_a_drafting_length_timed_in_a_slow_spell_is_timed_again_while_the_request_runs_plain(engine, prompt, reference, monkeypatch):
    """The mirror of the stale plain step: every drafting length was timed in a slow spell (1.7
    times its cost), the plain step since, and the request keeps 8 guesses in 10. By the table
    no draft pays; in truth two guesses do (2.44 tokens for 2 plain steps' time). Its probes do
    not mend the table: a probe is not a step's time, and one that keeps everything is followed
    by a longer one at once, so it is not timed even as a probe. The length the choice avoids
    is timed again (three steps in a row, the middle one timed), and the request drafts (it ran
    177 of its 187 cycles plain when only the plain step was timed again)."""
    lengths = DraftLengths()
    for positions in range(2, 10):
        lengths.observe(1, positions, 1.7 * (1 + 0.5 * (positions - 1)))
    lengths.observe(1, 1, 1.0)
    result = run_on_an_old_table(engine, prompt, reference, monkeypatch, lengths, break_probability=0.2)
    assert lengths.seconds[(1, 3)] == pytest.approx(2.0, abs=0.05), lengths.table()
    drafted = result.stats.cycles - result.stats.cycles_by_g.get(0, 0)
    assert drafted > 0.35 * result.stats.cycles, result.stats.cycles_by_g


def test_a_probe_between_plain_steps_costs_what_the_loop_paid_around_it():
    """A probe is a drafting step alone between plain ones: never timed as a step (its
    neighbours differ), but charged what the three intervals around it took over three plain
    steps (on MLX's CPU backend a step is computed as it is queued, in the interval before its
    own). Not where a neighbour drafts too, nor across other work."""
    from types import SimpleNamespace

    from mlx_spec.decoding.step_clock import StepClock

    def step(positions):
        return SimpleNamespace(shape=(1, positions), rows=1, positions=positions, traced=False)

    def run(clock, steps, start=0.0):
        """Settle each (positions, interval) in turn, the next queued behind it (a plain step
        behind the last)."""
        now = start
        for (positions, interval), (queued, _) in zip(steps, steps[1:] + [(1, None)]):
            now += interval
            clock.settled(step(positions), step(queued), now)
        return now

    lengths = DraftLengths()
    clock = StepClock(lengths)
    now = run(clock, [(1, 1.0), (1, 1.0), (1, 1.0), (2, 2.5), (1, 1.0)])
    assert lengths.seconds[(1, 1)] == 1.0 and (1, 2) not in lengths.seconds  # the probe is no step's time
    assert lengths.probe_extra == {(1, 2): 1.5}  # 1 + 2.5 + 1 less three plain steps
    plain, probing = lengths._probe_times(DraftLength(), 1)
    assert (plain, probing) == (1.0, 2.5)
    run(clock, [(1, 1.0), (3, 2.0), (2, 2.0), (1, 1.0), (1, 1.0)], now)  # two drafting steps in a row
    assert lengths.probes_timed == {(1, 2): 1}
    clock.interrupt()  # a prompt's chunk between the probe and its neighbours
    clock.settled(step(2), step(1), now + 10)
    clock.settled(step(1), step(1), now + 11)
    assert lengths.probes_timed == {(1, 2): 1}


def test_a_probe_s_measured_cost_not_the_line_s_sets_its_interval():
    """The line through the drafting lengths' times misses a draft step's fixed cost (on this
    project's CPU it put a probe at about half its real cost, and probes twice as often as
    their 1% where nothing is kept): once a probe has been timed, its interval weighs that, at
    every batch size."""
    alone = stopped_policy()
    lengths = alone.lengths
    lengths.seconds = {(1, 1): 1.0, (1, 7): 1.0 + 6 * 0.28}
    alone.policy.backoff = 1  # the interval itself, not its back-off
    before = alone.probe_every()
    lengths.observe_probe(1, 2, 0.6)
    assert alone.probe_every() == pytest.approx(before * 0.6 / 0.28, rel=0.1)
    # Beside other rows (rarely timed: their requests join, leave and probe too), the nearest
    # batch size's figure in proportion to a plain step's time.
    lengths.seconds[(4, 1)] = 2.0
    assert lengths._probe_times(alone.policy, 4) == pytest.approx((2.0, 2.0 * 1.6))


def test_a_probe_is_priced_by_what_it_may_keep():
    """A probe's interval weighs its extra time less what its guess may keep, counted one
    standard error above the estimate: while few observations say (near break-even, after a
    few unlucky misses), it comes sooner than the estimate alone would have it; where nothing
    was ever kept it costs its whole extra time, and comes rarely."""
    from mlx_spec.decoding.policy import PROBE_OVERHEAD

    def interval(acceptance, observations):
        policy = DraftLength()
        policy.stats.acceptance[0], policy.stats.judged[0] = acceptance, observations
        return policy.probe_every(1.0, 1.54)  # a probe of one guess costs 0.54 of a plain step

    assert interval(0.3, 3) < interval(0.3, 100) < (0.54 - 0.3) / PROBE_OVERHEAD
    assert interval(0.0, 100) == int(0.54 / PROBE_OVERHEAD)


def test_probes_are_timed_in_a_real_run(engine, prompt, reference, monkeypatch):
    """Where no guess is ever kept, the loop's probes go out between plain steps, and the cost
    model learns what one costs. (Modelled step times, a guess a fifth of a position: probes 20,
    40, 80 plain cycles apart, however busy the machine; this machine's own put the second probe
    past the 200th cycle in a slow spell.)"""
    modelled_step_times(monkeypatch, per_position=0.2, every_step=False)
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
    drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=1.0, seed=2)
    result = engine.generate(prompt, max_tokens=LONG, drafter=drafter)
    assert result.tokens == reference[len(prompt) :] and result.stats.kept == 0
    assert result.stats.cycles_by_g.get(1, 0) >= 2, result.stats.cycles_by_g
    assert (1, 2) in engine.draft_lengths.probe_extra, engine.draft_lengths.table()


def test_a_position_only_the_prior_judged_is_no_worse_than_the_request_s_own():
    """The engine's figure for a deep guess may be stale (its requests drafted short) or another
    content's: a request that keeps every short guess counts the deeper ones as good as its own
    deepest, so that it tries a longer draft and finds out; once it has judged them itself, its
    own figures count."""
    from mlx_spec.decoding.acceptance_stats import AcceptanceStats

    pooled = AcceptanceStats(8)
    for _ in range(40):
        pooled.observe(3, 1)  # the engine's requests: the first guess kept, the second not
    request = DraftLength(prior=pooled)
    assert request.stats.rates(3)[1] < 0.1  # before it judges anything: the engine's figures
    for _ in range(10):
        request.observe(1, 1)  # one guess a cycle, always kept
    assert request.stats.rates(3)[1] == request.stats.rates(3)[0] > 0.9
    for _ in range(10):
        request.observe(2, 1)  # its own second guesses: never kept
    assert request.stats.rates(3)[1] < 0.5


def _judged(stats, pattern, times):
    for k in range(times):
        stats.observe(1, pattern[k % len(pattern)])


def test_a_run_of_kept_guesses_moves_a_settled_figure_a_little():
    """At a = 0.7 five kept first guesses in a row follow any cycle with a chance of 0.17: over a
    moving average of 12 judgements they lifted the figure by 0.10, and the choice drafted long on
    it (docs/benchmarks.md, stop 69). Over 25 the figure moves about half as far."""
    from mlx_spec.decoding.acceptance_stats import AcceptanceStats

    stats = AcceptanceStats(8)
    _judged(stats, [1, 1, 0, 1, 1, 0, 1, 0, 1, 1], 100)  # seven in ten kept
    before = stats.acceptance[0]
    _judged(stats, [1], 5)
    assert stats.acceptance[0] - before < 0.07


def test_content_that_turns_hard_is_followed_at_least_as_fast_as_a_quick_average_would():
    """Nine in ten first guesses kept, then one in ten: the figure's slow average does not hold it
    up; the quicker one beside it tells the change, and from there the figure falls at least as
    fast as a moving average of 12 judgements alone would (which a = 0.7's lucky runs move)."""
    from mlx_spec.decoding.acceptance_stats import AcceptanceStats

    stats, quick = AcceptanceStats(8), AcceptanceStats(8, decay=0.92, quick_decay=None)
    hard = [0] * 9 + [1]
    for figures in (stats, quick):
        _judged(figures, [1] * 9 + [0], 100)
    followed = []
    for k in range(20):
        for figures in (stats, quick):
            figures.observe(1, hard[k % 10])
        followed.append(stats.acceptance[0] <= quick.acceptance[0] + 0.01)
    assert all(followed[5:]), [round(a, 2) for a in (stats.acceptance[0], quick.acceptance[0])]
    assert stats.acceptance[0] < 0.3


def test_a_plain_cycle_never_looks_free():
    """Two short drafts timed with noise (g = 2 fast, g = 3 slow) tilt the line through them
    below zero at g = 0: the prior bounds it there, and with every guess kept the policy drafts."""
    policy = Alone()
    policy.observe(2, 2, 0.100)
    policy.observe(3, 3, 0.165)
    assert policy.line(0) >= 0.100 / 1.5
    assert policy.fastest(8) > 0


def test_policy_finds_the_middle():
    # a = 0.6, each guess costs 0.3 of a step: E(g) / (1 + 0.3 g) is 1.00, 1.23, 1.23, 1.15,
    # 1.04 for g = 0..4: one or two guesses.
    chosen = simulate(Alone(), acceptance=0.6, cycles=600)
    assert chosen.get(1, 0) + chosen.get(2, 0) > 0.7 * sum(chosen.values())


def test_policy_drafts_again_when_content_becomes_predictable():
    """Within MAX_PROBE_INTERVAL plain cycles (the longest wait between probes, however many
    kept nothing) a probe notices, and two cycles later the draft is long again."""
    from mlx_spec.decoding.policy import MAX_PROBE_INTERVAL

    policy = Alone()
    simulate(policy, acceptance=0.0, cycles=400)
    chosen = simulate(policy, acceptance=1.0, cycles=MAX_PROBE_INTERVAL + 300, seed=1)
    late = sum(v for g, v in chosen.items() if g >= 6)
    assert late >= 300 - 3


def stopped_policy():
    """A policy that has stopped drafting, with its next probe about to be handed out while a
    plain cycle runs (the loop chooses each cycle while the one before it runs)."""
    policy = Alone()
    simulate(policy, acceptance=0.0, cycles=100)
    while policy.choose(budget=100) == 0:
        policy.observe(0, 0, 1.0)
    return policy


def test_a_probe_is_handed_out_once_until_it_settles_or_is_withdrawn():
    policy = stopped_policy()
    policy.observe(0, 0, 1.0)  # the plain cycle that ran while the probe was chosen
    assert policy.choose(budget=100) == 0  # chosen while the probe runs: no second probe
    policy.withdraw()  # that cycle was thrown away unrun; so was the probe
    assert policy.choose(budget=100) == policy.policy.probe_g
    policy.observe(policy.policy.probe_g, 0, 1.3)
    assert policy.choose(budget=100) == 0  # the probe settled: the next one waits its turn


def test_a_probe_that_keeps_everything_is_followed_by_a_longer_one():
    """In the loop's order: probe chosen, the plain cycle before it settles, the next cycle
    chosen while the probe runs, the probe settles."""
    policy = stopped_policy()
    policy.observe(0, 0, 1.0)
    assert policy.choose(budget=100) == 0
    probe_g = policy.policy.probe_g
    policy.observe(probe_g, probe_g, 1.3)  # every guess kept
    assert policy.choose(budget=100) == min(4 * probe_g, 8)


def test_a_probe_that_keeps_what_was_expected_is_followed_by_no_longer_one():
    """Near break-even (a guess costs 0.62 of a pass, half the guesses are kept) a request runs
    plain and every other probe keeps its guess. That is what its figures expected, not news: a
    four-guess probe after it would cost 2.4 passes for about 1.9 tokens, every other probe.
    (Before, every probe that kept everything was followed by one; the noise-free simulation of
    the bars' order read 0.955 of the best fixed length at a = 0.5 with it, 0.963 without.)"""
    def cost(g):
        return 1.0 if g == 0 else 1.26 + 0.36 * g

    policy, rng = Alone(), np.random.default_rng(0)
    simulate(policy, acceptance=0.5, cycles=300, cost=cost)
    # The cycles go on until a probe goes out while the figure makes keeping its guess likely
    # (where the figure is higher the choice drafts without a probe; where probes missed in a
    # row have pulled it below a third, a kept probe is news).
    for _ in range(3000):
        g = policy.choose(budget=100)
        if policy.policy.probe_out and g == policy.policy.probe_g and 1 / 3 < policy.policy.stats.rates(1)[0] < 0.8:
            break
        policy.observe(g, drawn(rng, g, 0.5), cost(g))
    else:
        pytest.fail("no periodic probe went out while the figure lay between a third and 0.8")
    probe_g = policy.policy.probe_g
    policy.observe(0, 0, 1.0)  # the plain cycle that ran while the probe was chosen
    policy.choose(budget=100)  # chosen while the probe runs
    policy.observe(probe_g, probe_g, cost(probe_g))  # the probe keeps everything
    assert policy.policy.probe == 0
    assert policy.choose(budget=100) < 4 * probe_g


def test_a_row_that_drafted_beside_others_before_its_first_probe_still_climbs():
    """In a batch a new row's first probe waits for one that is due, and the row may draft beside
    the others meanwhile. Its first probe, when it goes out, is still the opening: keeping
    everything, it is followed by a longer one, however likely its figures made that."""
    policy = DraftLength()
    policy.observe(3, 3, asked=3)  # a step chosen for the batch: not the row's probe
    assert policy.first
    g = policy.take_probe()
    policy.handed_out(g)
    policy.observe(g, g)  # the first probe keeps everything
    assert policy.probe == min(4 * g, policy.max_g)


def test_a_probe_whose_drafter_proposed_nothing_still_ends():
    """Prompt lookup may propose no guess: the probe ran with none, and probing goes on later."""
    policy = stopped_policy()
    policy.observe(0, 0, 1.0)
    policy.observe(0, 0, 1.0, asked=policy.policy.probe_g)
    probes = 0
    for _ in range(3 * 128):  # MAX_PROBE_INTERVAL: the longest wait between two probes
        g = policy.choose(budget=100)
        probes += g > 0
        policy.observe(g, 0, 1.0 + 0.3 * g)
    assert probes >= 2


def probes_in(policy, cycles, acceptance, seed=0):
    """How many probes `policy` hands out over `cycles` cycles whose guesses are kept with
    probability `acceptance` (a guess costs 0.3 of a pass)."""
    rng, probes = np.random.default_rng(seed), 0
    for _ in range(cycles):
        g = policy.choose(budget=100)
        probes += g > 0
        kept = drawn(rng, g, acceptance)
        policy.observe(g, kept, 1.0 + 0.3 * g)
    return probes


def test_probes_that_keep_nothing_back_off():
    """Where nothing is ever kept, each empty probe doubles the wait for the next (up to
    MAX_PROBE_INTERVAL cycles): over 3,000 cycles far fewer probes than at a fixed interval,
    never fewer than the cap allows; a probe that keeps something resets the wait."""
    from mlx_spec.decoding.policy import MAX_PROBE_INTERVAL

    policy = stopped_policy()
    policy.observe(policy.policy.probe_g, 0, 1.3)  # the probe handed out settles, keeping nothing
    fixed = 3000 * policy.policy.backoff // policy.probe_every()  # probes at the interval without back-off
    probes = probes_in(policy, 3000, acceptance=0.0)
    assert 3000 // (MAX_PROBE_INTERVAL + 1) <= probes < fixed / 2 and policy.policy.backoff > 1
    probes_in(policy, 2 * MAX_PROBE_INTERVAL, acceptance=1.0)
    assert policy.policy.backoff == 1


def engine_after(acceptance, cost, requests=9, seed=0):
    """An engine's cost model and pooled acceptance after `requests` requests whose guesses were
    kept with probability `acceptance` (MTP off first, then fixed g = 1, 2, ...), each cycle
    costing cost(g) seconds."""
    lengths, rng = DraftLengths(), np.random.default_rng(seed)
    for fixed in range(requests):
        policy = DraftLength(fixed=fixed, prior=lengths.acceptance)
        for _ in range(100):
            g = lengths.choose([Ask(policy, 100)])[0]
            kept = drawn(rng, g, acceptance)
            policy.observe(g, kept)
            lengths.observe(1, g + 1, cost(g))
    return lengths


def cpu_cost(g):
    """A cycle's cost on this project's CPU, roughly: one guess costs 0.62 of a plain pass (the
    drafter's step and a second position), each more 0.36."""
    return 1.0 if g == 0 else 1.26 + 0.36 * g


def run_request(lengths, kept_of, cycles=200):
    """One adaptive request on `lengths`: kept_of(cycle, g) says how many of g guesses are kept.
    Returns the g of each cycle."""
    policy, chosen = DraftLength(prior=lengths.acceptance), []
    for cycle in range(cycles):
        g = lengths.choose([Ask(policy, 100)])[0]
        policy.observe(g, kept_of(cycle, g))
        lengths.observe(1, g + 1, cpu_cost(g))
        chosen.append(g)
    return chosen


def test_a_first_probe_that_misses_near_break_even_is_not_the_last_word():
    """On an engine whose requests kept half their guesses (drafting does not pay there: one
    guess costs 0.62 of a pass), a request that keeps 3 guesses in 4 (it pays) whose first probe
    misses: one miss is one observation, and near break-even a probe costs next to nothing (its
    extra time less what it is expected to keep), so it probes again soon and drafts most of
    its cycles (the old interval, the probe's whole extra time over 1% with its back-off, left
    it plain for 120 cycles)."""
    lengths = engine_after(0.5, cpu_cost)
    pattern = [1, 1, 0, 1]  # 3 in 4 first guesses kept
    chosen = run_request(lengths, lambda cycle, g: 0 if cycle == 0 else min(g, pattern[cycle % 4]))
    assert chosen[0] > 0 and 0 < chosen[1:40].count(0) < 39
    assert sum(g > 0 for g in chosen) > 0.6 * len(chosen), chosen


def test_a_plain_step_timed_in_a_slow_spell_is_timed_again_while_drafting_is_close():
    """The bench's order on a machine whose speed drifts: MTP off timed while the machine was
    slow (a plain step 1.6), then a fixed g = 1 timed once it was fast again (1.6 for one guess,
    the plain step now 1.0), then an adaptive request that keeps 3 first guesses in 10. Its
    table reads one guess at the old plain step's time, so one guess looks worth drafting
    (1.3 tokens for the time of 1.0); it is not (1.3 for 1.6). A length the choice avoids is
    not timed: while the request drafted, the plain step kept its slow-spell time (158 of 159
    cycles drafted in such a run of the bench). A plain step whose time is old, beside a choice
    that beats it by little, is timed again (a few plain steps: where the margin is small, they
    cost little), and its old time weighs little against the new one."""
    slow, fast = (lambda g: 1.6 * cpu_cost(g)), cpu_cost
    lengths, rng = DraftLengths(), np.random.default_rng(0)
    for fixed, cost in ((0, slow), (1, fast)):
        policy = DraftLength(fixed=fixed, prior=lengths.acceptance)
        for _ in range(100):
            g = lengths.choose([Ask(policy, 100)])[0]
            policy.observe(g, drawn(rng, g, 0.3))
            lengths.observe(1, g + 1, cost(g))
    assert lengths.seconds[(1, 1)] == pytest.approx(1.6) and lengths.seconds[(1, 2)] == pytest.approx(1.62)
    chosen = run_request(lengths, lambda cycle, g: drawn(rng, g, 0.3))
    assert chosen[150:].count(0) > 0.8 * 50, chosen
    assert lengths.seconds[(1, 1)] == pytest.approx(1.0, rel=0.05)


def test_an_engine_that_kept_everything_does_not_make_a_request_that_keeps_nothing_draft_long():
    """The deep positions a request has not judged itself follow the prior scaled by how the
    request does where it has judged: keeping nothing of its first guesses, it stops drafting
    long within a few cycles (it used to count them as good as the engine's, 1.0, and drafted 8
    guesses ten cycles running)."""
    lengths = engine_after(1.0, cpu_cost)
    chosen = run_request(lengths, lambda cycle, g: 0, cycles=60)
    assert sum(g >= 2 for g in chosen) <= 3 and sum(chosen) <= 16, chosen


def test_deep_figures_the_engine_has_not_judged_for_long_are_not_handed_over():
    """An engine whose requests once kept every guess, then drafted one guess at a time for a
    while (the deep positions never judged since): a new request that keeps half its first
    guesses must not draft long on the old deep figures, another content's (it drafted 8
    guesses from its first cycle on them: a guess costs 0.36 of a pass there, and the old
    figures said every guess after a kept first one is kept). Figures judged lately are handed
    over. (It still probes: two guesses first, then one now and then, and four after one that
    kept its guess.)"""
    lengths = engine_after(1.0, cpu_cost)
    assert DraftLength(prior=lengths.acceptance).stats.rates(8)[7] > 0.9  # fresh: handed over
    one_guess = DraftLength(fixed=1, prior=lengths.acceptance)
    for cycle in range(100):
        one_guess.observe(1, cycle % 2)
    rates = DraftLength(prior=lengths.acceptance).stats.rates(8)
    assert rates[1:] == [rates[0]] * 7 and rates[0] < 0.7, rates
    chosen = run_request(lengths, lambda cycle, g: min(g, 1) if cycle % 2 else 0, cycles=20)
    assert chosen[0] <= 2 and max(chosen) <= 4, chosen  # its first probe, and periodic ones climbing once


def request_whose_second_guess_misses_early(misses):
    """The g of each of 60 cycles of a request that keeps every guess, except that its second
    guess misses the first `misses` times it is judged; on an engine whose requests kept 9 in 10
    guesses and then drafted one a cycle for a while (the deep figures are not handed over)."""
    lengths = engine_after(0.9, cpu_cost)
    one_guess = DraftLength(fixed=1, prior=lengths.acceptance)
    for _ in range(100):
        one_guess.observe(1, 1)
    judged = []

    def kept_of(cycle, g):
        if g >= 2 and len(judged) < misses:
            judged.append(cycle)
            return 1
        return g

    return run_request(lengths, kept_of, cycles=60)


def test_one_miss_at_a_deeper_guess_s_first_judgement_does_not_set_it_to_nothing():
    """Its first news is weighed against the figure assumed for it (as good as the first guess),
    worth a prior's observations: the request climbs back to long drafts within ten cycles (it
    used to set that guess's figure to 0 and then 0.5 after one keep, and draft one guess a
    cycle for the rest of its answer)."""
    chosen = request_whose_second_guess_misses_early(misses=1)
    assert min(chosen[1:]) >= 2 and chosen[10:] == [8] * 50, chosen


def test_a_deeper_guess_not_judged_lately_is_tried_again():
    """Five misses at the second guess make one guess a cycle the best choice for a while; once
    the request has drafted one guess for a moving average's worth of cycles, all of them kept,
    the second guess's old figure no longer holds it back: it drafts long again (it drafted one
    guess for the rest of its answer)."""
    chosen = request_whose_second_guess_misses_early(misses=5)
    assert 1 in chosen[:20] and chosen[-30:] == [8] * 30, chosen


def test_where_the_engine_s_guesses_are_never_kept_a_first_probe_asks_only_the_free_drafters():
    """A request's first probe asks whether its own content is easier to guess than the engine's
    recent ones. Where the engine's requests judged the first guess a moving average's worth of
    times and never kept it, the assistant is not worth that probe: it is drafted by the free
    drafters alone (prompt lookup), and the flag ends with the probe. Where the engine's guesses
    were kept half the time, or judged only a few times, the assistant drafts it too."""
    for acceptance, free in ((0.0, True), (0.5, False)):
        lengths = engine_after(acceptance, cpu_cost)
        policy = DraftLength(prior=lengths.acceptance)
        assert lengths.choose([Ask(policy, 100)])[0] == 2 and policy.free_only == free, acceptance
        policy.observe(0, 0, asked=2)  # lookup found nothing to copy
        assert not policy.free_only and not policy.first and policy.probe == 0
    few = DraftLengths()
    for positions, ms in ((1, 10.0), (2, 16.2)):
        few.observe(1, positions, ms / 1000)
    for _ in range(10):
        few.acceptance.observe(1, 0)
    policy = DraftLength(prior=few.acceptance)
    assert few.choose([Ask(policy, 100)])[0] == 2 and not policy.free_only


def test_a_free_first_probe_is_exact_and_still_finds_repeated_text(engine, monkeypatch):
    """The tiny assistant's guesses are never kept. Once the engine has judged enough of them, a
    request's first probe is prompt lookup's alone, alone and inside a batch (where it goes out at
    once: where lookup finds nothing it costs nothing): no answer drafts anything by the
    assistant in its first 24 tokens (a periodic probe comes after 30 plain cycles here), a
    request whose text repeats itself still finds it, and every answer is MTP off's."""
    modelled_step_times(monkeypatch, per_position=0.3)
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
    rng = np.random.RandomState(5)
    for _ in range(3):
        engine.generate(rng.randint(5, tiny.VOCAB, size=40).tolist(), max_tokens=30, draft_tokens=2, lookup=False)
    assert engine.draft_lengths.acceptance.judged[0] >= 50
    block = rng.randint(5, 300, size=20).tolist()
    prompts = [block * 3, rng.randint(5, tiny.VOCAB, size=60).tolist(), block[::-1] * 3]
    alone = [engine.generate(prompt, max_tokens=24) for prompt in prompts]
    together = engine.generate_many(prompts, max_tokens=24)
    for prompt, answers in zip(prompts, zip(alone, together)):
        off = engine.generate(prompt, max_tokens=24, mtp=False).tokens
        assert all(a.tokens == off and a.stats.drafted_by_source.get("mtp", 0) == 0 for a in answers)
    assert alone[0].stats.drafted_by_source.get("lookup", 0) > 0
    assert together[0].stats.drafted_by_source.get("lookup", 0) > 0


def test_rows_of_a_batch_probe_in_shared_steps():
    """Eight rows whose guesses are never kept, joining a batch one every ten steps: a probe step
    costs every row, so the rows whose probes are near go out together, and a new row's first
    probe waits for one (a generation alone probes at once). Over 2,000 steps the probe steps
    are far fewer than the rows' probes, every row still probes, and the rows fall into step."""
    lengths = DraftLengths()
    for positions, ms in ((1, 10.0), (2, 17.0), (3, 24.0)):  # a batch of 8 on this CPU, roughly
        lengths.observe(8, positions, ms / 1000)
    rows = []
    probe_steps, probes = 0, [0] * 8
    for step in range(2000):
        if step % 10 == 0 and len(rows) < 8:
            rows.append(DraftLength())
        asks = [Ask(p, 100) for p in rows] + [Ask(None, 0)] * (8 - len(rows))  # the storage's 8 rows
        gs = lengths.choose(asks)[: len(rows)]
        probe_steps += any(gs)
        for i, (policy, g) in enumerate(zip(rows, gs)):
            probes[i] += g > 0
            policy.observe(g, 0)
    assert min(probes) >= 2 and probe_steps < sum(probes) / 3, (probe_steps, probes)
    alone = DraftLength()
    assert lengths.choose([Ask(alone, 100)])[0] == 2  # alone: its first probe at once


def test_policy_respects_the_budget():
    policy = Alone()
    assert all(policy.choose(budget=3) <= 2 for _ in range(20))
    assert policy.choose(budget=1) == 0


@pytest.fixture(scope="module")
def prompt():
    block = np.random.RandomState(4).randint(0, tiny.VOCAB, size=tiny.WINDOW + 3).tolist()
    return block * 3  # repeats itself: the lookup finds matches


@pytest.fixture(scope="module")
def reference(engine, prompt):
    return prompt + engine.generate(prompt, max_tokens=LONG, mtp=False).tokens


def test_default_drafting_is_exact_and_adaptive(engine, prompt, reference, monkeypatch):
    """On a fresh engine (the module's engine has served requests that kept nothing, after
    which a request rightly probes rarely), the default drafts, from MTP and from lookup."""
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
    result = engine.generate(prompt, max_tokens=LONG)
    assert result.tokens == reference[len(prompt) :]
    assert len(result.stats.cycles_by_g) > 1  # the draft length changed along the way
    assert result.stats.drafted_by_source.get("lookup", 0) > 0


def test_adaptive_with_scripted_acceptance_is_exact(engine, prompt, reference, monkeypatch):
    # The cost model sees modelled step times (a pass 1, each guess 0.05 more), so that its
    # choices do not depend on how busy this machine is; the tokens never depend on them.
    modelled_step_times(monkeypatch)
    stats = {}
    for p in (0.0, 0.4, 1.0):  # the probability that a guess is broken
        # Each request on an engine of its own: what one request learns alone (only modelled
        # times in it, and no acceptance from earlier requests).
        monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
        drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=p, seed=2)
        result = engine.generate(prompt, max_tokens=LONG, drafter=drafter)
        assert result.tokens == reference[len(prompt) :]
        stats[p] = result.stats
    assert max(stats[0.0].cycles_by_g, key=stats[0.0].cycles_by_g.get) == 8
    # Never kept: drafting shrinks to nothing or next to nothing (a free one-guess draft is as
    # good as none when the scripted drafter costs nothing).
    never = stats[1.0]
    assert never.kept == 0 and never.mean_g < 1.2
    assert sum(n for g, n in never.cycles_by_g.items() if g >= 2) < 0.05 * never.cycles


@contextmanager
def recorded_lengths(monkeypatch):
    """The g of every cycle settled inside the block, in order, as the requests' draft lengths saw them."""
    lengths, observe = [], DraftLength.observe
    monkeypatch.setattr(DraftLength, "observe", lambda self, g, kept, asked=None, pooled=True: (
        lengths.append(g), observe(self, g, kept, asked, pooled)))
    try:
        yield lengths
    finally:
        monkeypatch.setattr(DraftLength, "observe", observe)


def test_a_request_starts_from_the_engine_s_acceptance(engine, prompt, reference, monkeypatch):
    """The engine pools how guesses fare over its requests, and a new request starts from it:
    after requests that keep every guess, the next drafts long from its first cycle (no probe
    of two first); after requests that keep none, the next probes once (its own content might
    be easier to guess) and then drafts nothing."""
    modelled_step_times(monkeypatch)
    for p in (0.0, 1.0):
        monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
        for _ in range(3):
            drafter = ScriptedDrafter(reference, tiny.VOCAB, break_probability=p, seed=2)
            engine.generate(prompt, max_tokens=60, drafter=drafter)
        with recorded_lengths(monkeypatch) as lengths:
            result = engine.generate(prompt, max_tokens=60, drafter=ScriptedDrafter(reference, tiny.VOCAB, break_probability=p, seed=3))
        assert result.tokens == reference[len(prompt) : len(prompt) + 60]
        if p == 0.0:
            assert lengths[0] >= 6, lengths
        else:
            assert lengths[0] == 2 and lengths[1:].count(0) > 0.9 * len(lengths[1:]), lengths


def test_guesses_copied_from_a_request_s_text_are_not_where_the_next_request_starts(engine, prompt, reference, monkeypatch):
    """A request starts from the engine's pooled acceptance. Guesses copied from a request's own
    text (`Draft.copied`, as prompt lookup's are) are kept where that text repeats itself, and
    say nothing of how the next request's are guessed: after requests whose every guess was
    copied and kept, alone and together, the engine's acceptance has judged nothing, and a
    request whose guesses are never kept probes as on a fresh engine (two guesses first, then
    next to nothing). It drafted 8 guesses in its first cycles on them, at a cost of up to three
    plain steps each where the tiny target is overhead-bound."""
    modelled_step_times(monkeypatch)
    monkeypatch.setattr(engine, "draft_lengths", DraftLengths())
    for _ in range(2):
        result = engine.generate(prompt, max_tokens=60, drafter=ScriptedDrafter(reference, tiny.VOCAB, copied=True))
        assert result.tokens == reference[len(prompt) : len(prompt) + 60] and result.stats.kept > 40
    together = engine.generate_many([prompt, prompt], max_tokens=60,
                                    drafter=ScriptedDrafter(reference, tiny.VOCAB, copied=True, strict=False))
    assert all(r.tokens == reference[len(prompt) : len(prompt) + 60] and r.stats.kept > 40 for r in together)
    copied_judged = engine.draft_lengths.acceptance.judged_any
    with recorded_lengths(monkeypatch) as lengths:
        result = engine.generate(prompt, max_tokens=60, drafter=ScriptedDrafter(reference, tiny.VOCAB, break_probability=1.0))
    assert result.tokens == reference[len(prompt) : len(prompt) + 60]
    assert max(lengths) <= 3 and sum(lengths) <= 9, lengths
    assert not copied_judged and engine.draft_lengths.acceptance.judged[0] > 0  # its own guesses are pooled


def test_prompt_lookup_s_guesses_are_marked_copied(checkpoints, prompt, reference):
    """Alone and in a batch: an engine whose only drafter is prompt lookup drafts on a prompt
    that repeats itself, and its pooled acceptance judges none of those guesses. (A fixed length:
    whether the adaptive one drafts in 40 tokens depends on the step times, and a CI run once
    found a row that had not.)"""
    plain = load(str(checkpoints["text"]), drafter=None).with_stop_tokens([])
    alone = plain.generate(prompt, max_tokens=40, draft_tokens=2)
    together = plain.generate_many([prompt, prompt[1:]], max_tokens=40, draft_tokens=2)
    assert alone.tokens == together[0].tokens == reference[len(prompt) : len(prompt) + 40]
    assert all(r.stats.drafted_by_source.get("lookup", 0) > 0 for r in (alone, *together))
    assert not plain.draft_lengths.acceptance.judged_any


def test_lookup_alone_without_an_assistant(checkpoints, prompt, reference):
    plain = load(str(checkpoints["text"]), drafter=None)
    plain = plain.with_stop_tokens([])
    result = plain.generate(prompt, max_tokens=LONG)
    assert result.tokens == reference[len(prompt) :]
    assert set(result.stats.drafted_by_source) <= {"lookup"}


def test_same_seed_same_tokens_with_lookup(engine, prompt):
    settings = dict(temperature=1.0, top_k=64, top_p=0.95, seed=11)
    off = engine.generate(prompt, max_tokens=LONG, mtp=False, **settings)
    on = engine.generate(prompt, max_tokens=LONG, **settings)
    assert on.tokens == off.tokens


def test_the_fastest_length_is_the_best_expected_rate():
    """The length is found in one pass; it must be the g that maximises E(g) / T(g), the
    shortest on a tie, in any measured state: E from the acceptance statistics, T the measured
    time (a line through the measured lengths for the others), never above a longer draft's
    measured time."""

    def cycle_seconds(alone, g):
        longer = [alone.measured(k) for k in range(g + 1, 9) if alone.measured(k) is not None]
        return min([alone.measured(g) if alone.measured(g) is not None else alone.line(g), *longer])

    rng = random.Random(5)
    for trial in range(300):
        alone = Alone()
        for _ in range(rng.randint(0, 30)):
            g = rng.randint(0, 8)
            alone.observe(g, rng.randint(0, g), rng.uniform(0.001, 0.02))
        limit = rng.randint(0, 8)
        if alone.policy.stats.expected_tokens(limit) <= 1.0:
            # No guess expected kept: none, unweighed (only noise makes a draft look cheaper).
            assert alone.fastest(limit) == 0, trial
            continue
        rates = [alone.policy.stats.expected_tokens(g) / cycle_seconds(alone, g) for g in range(limit + 1)]
        assert alone.fastest(limit) == rates.index(max(rates)), trial


def test_one_slow_timing_does_not_hold_the_choice_short():
    """Guesses kept about 9 in 10, each guess 0.3 of a plain step: three to six guesses are best. Steps
    of two guesses timed at nearly four times their cost (the machine busy for a moment) must
    not hold every longer length to that time (one guess would then look best): the choice stays
    long, and the slow length's own time is bounded by the cheapest longer step's."""
    alone = Alone()
    for g in range(1, 9):
        for _ in range(4):
            alone.observe(g, drawn(random.Random(g), g, 0.9), None)
    for g in range(9):
        alone.lengths.observe(1, g + 1, 0.010 * (1 + 0.3 * g))
    for _ in range(3):
        alone.lengths.observe(1, 3, 0.060)  # a slow moment, kept in the moving average
    assert alone.measured(2) > alone.measured(8)
    assert 3 <= alone.fastest(8) <= 6
    assert alone.lengths.step_times(1, [3, 9]) == [alone.measured(3), alone.measured(8)]  # the cheapest longer step's


def test_a_cycle_whose_time_is_unknown_still_counts_its_guesses():
    """observe(..., seconds=None): the acceptance learns from the cycle, the timing does not."""
    alone = Alone()
    alone.observe(3, 3, None)
    assert alone.measured(3) is None and (1, 4) not in alone.lengths.timed
    assert alone.policy.stats.own[:3] == [1, 1, 1] and alone.policy.stats.acceptance[:3] == [1.0] * 3
    alone.observe(3, 1, 0.02)
    assert alone.measured(3) == 0.02 and alone.lengths.timed[(1, 4)] == 1


def test_cycles_that_trace_are_not_timed_and_the_steady_state_traces_nothing(checkpoints, prompt, monkeypatch):
    """A fresh engine's first step at each length traces its compiled passes (a trace takes
    several steps' time): the cost model is not charged for it. No other step traces (until a
    buffer grows): the same length replays its graphs, built ahead or not."""
    from mlx_spec.decoding.sequence import SequenceState

    engine = load(str(checkpoints["text"]), str(checkpoints["assistant"]))  # nothing traced yet
    decoder = engine.decoder(draft_tokens=2, lookup=False, report=False)
    steps = []  # (positions, seconds) of each settled step
    observe = DraftLengths.observe
    monkeypatch.setattr(DraftLengths, "observe", lambda self, rows, positions, seconds: (
        steps.append((positions, seconds)), observe(self, rows, positions, seconds)))
    state = SequenceState(engine.target)
    decoder.add_tokens(state, prompt[:40])
    list(decoder.generate(state, 30))  # g = 2, then 1 and 0 where the budget ends
    firsts = [i for i, (n, _) in enumerate(steps) if n not in [m for m, _ in steps[:i]]]
    untimed = [i for i, (_, seconds) in enumerate(steps) if seconds is None]
    # Every step that traced is untimed; so are the steps where the length changes (their
    # interval holds a neighbour's work) and the last; every other step is timed.
    changes = {i for i in range(len(steps)) if i == len(steps) - 1 or i == 0
               or steps[i - 1][0] != steps[i][0] or steps[i + 1][0] != steps[i][0]}
    assert set(firsts) <= set(untimed) <= set(firsts) | changes
    assert len(untimed) < len(steps) - 5


def test_one_paused_step_moves_its_length_s_figure_little_and_a_lasting_slowdown_is_followed():
    """A step the machine paused in (ten times its length's time) moves the figure by at most a
    moving average's share of half the figure: on this project's CPU such steps at a run's end left
    a plain step at 1.6 times its run's median. A slowdown that lasts is followed all the same."""
    lengths = DraftLengths()
    for _ in range(30):
        lengths.observe(1, 2, 0.010)
    lengths.observe(1, 2, 0.100)
    assert lengths.seconds[(1, 2)] <= 0.010 * (1 + (1 - lengths.decay) * 0.5) + 1e-12
    for _ in range(30):
        lengths.observe(1, 2, 0.020)
    assert lengths.seconds[(1, 2)] == pytest.approx(0.020, rel=0.05)
    lengths.observe(1, 2, 0.005)  # a faster step moves it as before: by the average's share of the whole gap
    assert lengths.seconds[(1, 2)] == pytest.approx(0.020 - (1 - lengths.decay) * 0.015, rel=0.05)
