"""The bars of `mlx-spec bench controlled`: configurations run in interleaved rounds, and each
bar the median over the rounds of a ratio within a round, shown with the middle half of the
rounds (how far the machine's noise reaches). The prediction bars divide each round by R_g + C_g
timed in that round. Within a round every configuration runs `--best-of` times and the round
takes its fastest run (see `fastest_of`).

At every acceptance of the sweep the default (the adaptive length) is set against the best of
MTP off and every fixed g: the draft length the cost model chooses must be as good as the best
one could have fixed knowing the acceptance. Each acceptance's runs follow each other, with a run
of MTP off of their own next to the adaptive one: on this project's VM the speed moves by a
fifth within seconds, so a rival timed a minute away is set against another machine.

Each round draws its own text: which positions are predictable at acceptance a (the controlled
drafter's seed is the round's number), the same for every configuration of the round. With one
text for every round, the rounds would repeat one draw of it, and the adaptive length's figure
would be its luck on that draw (where its runs of kept guesses fall decides when it drafts; a
fixed g only counts them), not what it does on text of that acceptance. The policy's own
simulation put the spread between draws of 200 tokens at a = 0.5 at several percent
(docs/benchmarks.md).

Each round also runs MTP off a second time, at the round's other end: one configuration set
against itself shows how far this machine's noise moves a round's ratio, and how low a median
of that many rounds of it falls one time in 20. A bar missed by less than that is said to be
inside the noise: this run does not decide it either way.
"""

import random
import statistics

from .common import markdown
from .prefills import prompt_sequence
from .runs import ControlledDrafter, cost_ratios, device_ms, expected_tokens

AGAIN = "MTP off, again"
# Fewer rounds than this say nothing of how far the noise reaches: the bootstrap of one ratio is
# that ratio (a quick run's MTP off read 0.44 of itself, and its "low median" read 1.00).
NOISE_ROUNDS = 3


def bars(setup, sweep_entries: list, progress) -> dict:
    """The bars, each the median over `--trials` interleaved rounds of a ratio within a round."""
    # The bars compare runs a few percent apart, so they are measured again in `--trials`
    # interleaved rounds (the sweep is one round: a single run of it gave a = 1's measured /
    # predicted as 0.81 in one run and 1.21 in another on this project's machine). Runs compared
    # with each other follow each other, so a machine that slows down for a while slows both.
    args, engine, g = setup.args, setup.engine, setup.g
    configs, lengths = configurations(setup)

    def alone_ms():
        drafter = ControlledDrafter(engine.mtp_drafter, setup.reference, engine.target.vocab_size, 1.0)
        with prompt_sequence(engine, engine.decoder(mtp=False), setup.prompt, prefills=setup.prefills) as state:
            return device_ms(engine, state, drafter, g)

    def begin_round(trial):
        setup.text_seed = trial  # the round's text (the module's docstring)
        _, ratios = cost_ratios(engine, setup.prompt, [g], repeats=5, prefills=setup.prefills)
        return ratios[g]["R"] + ratios[g]["C"]

    timed_alone = f"g = {g}, a = 1" if 1.0 in args.acceptance else None
    runs, efficiency, costs = interleaved_rounds(configs, args.trials, args.best_of, timed_alone, alone_ms,
                                                 begin_round, lambda trial: progress.step(f"bars, round {trial + 1}"))
    trials = {name: [fastest_of(passes) for passes in rounds] for name, rounds in runs.items()}
    tps = {name: statistics.median(values) for name, values in trials.items()}
    # The breakdown printed is a middle round's (the lower middle of an even number); the bar
    # takes the median of every round's efficiency.
    loop = sorted(efficiency, key=lambda e: e["efficiency"])[(len(efficiency) - 1) // 2] if efficiency else None
    if loop is not None:
        print_loop_efficiency(loop, g, statistics.median(e["efficiency"] for e in efficiency), len(efficiency))
    best = {a: max(candidates(setup, a), key=tps.get) for a in args.acceptance}
    print(f"\nMedian of {args.trials} interleaved rounds, each the fastest of {args.best_of} run(s) (tok/s; the bars below "
          "take the median of each round's ratio):\n")
    print(markdown(["run", "tok/s", "rounds"], [[n, f"{t:.1f}", ", ".join(f"{v:.1f}" for v in trials[n])] for n, t in tps.items()]))
    reach = noise(trials)
    measured = judged_bars(setup, trials, costs, efficiency, sweep_entries, best, reach["low_median"])
    rows = [[bar["bar"], f"{bar.get('ratio', bar.get('value')):.2f}",
             "{:.2f}-{:.2f}".format(*bar["middle_half"]) if "middle_half" in bar else "",
             verdict(bar)] for bar in measured]
    print("\n" + markdown(["bar", "figure", f"middle half of the {args.trials} rounds", "met"], rows))
    print(f"\nThis machine's noise: MTP off over a second MTP off run in the same round reads {reach['median']:.2f} "
          + ("(middle half {:.2f}-{:.2f}); a median of {} such rounds falls to {:.2f} of its own figure one time in 20. "
             "A bar missed by less than that is inside the noise: not decided by this run.".format(
                 *reach["middle_half"], args.trials, reach["low_median"]) if reach["low_median"] is not None else
             f"in {args.trials} round(s), too few to say how far it reaches ({NOISE_ROUNDS} or more do): "
             "a bar this run misses is not decided by it."))
    print("\nThe adaptive length against the best over all the rounds (the reference those rounds chose, biased "
          "upward), by acceptance: " + ", ".join(f"a = {a:g} {bar['in_sample_ratio']:.2f}" for a, bar in
                                                  zip(args.acceptance, [b for b in measured if "in_sample_ratio" in b])))
    median_efficiency = statistics.median(e["efficiency"] for e in efficiency) if efficiency else None
    return {"loop_efficiency": {"median": median_efficiency, "middle_round": loop, "rounds": efficiency},
            "trials": trials, "runs": runs,
            "best_of": args.best_of, "median_tps": tps, "best": {f"{a:g}": name for a, name in best.items()},
            "costs": costs, "text_seeds": list(range(args.trials)), "adaptive_cycles_by_g": lengths, "bars": measured,
            "noise": reach}


def configurations(setup):
    """(name -> run, in the round's order; name -> what each adaptive run drafted)."""
    configs = {"mlx-lm": setup.mlx_lm, "MTP off": setup.mtp_off,
               "copy (free guesses), adaptive": lambda: setup.controlled(1.0, None, inner=None)}
    for a in setup.args.acceptance:
        # MTP off again beside each acceptance's runs, next to its adaptive run in either order
        # of the round: the rival it is set against is timed seconds from it, not a minute.
        configs[beside(a)] = setup.mtp_off
        configs[f"adaptive, a = {a:g}"] = lambda a=a: setup.controlled(a, None)
        for n in fixed_lengths(setup):
            configs[f"g = {n}, a = {a:g}"] = lambda a=a, n=n: setup.controlled(a, n)
    lengths = record_lengths(configs, [name for name in configs if "adaptive" in name])
    configs[AGAIN] = setup.mtp_off  # last: the round's other end from MTP off (the module's docstring)
    return configs, lengths


def noise(trials: dict, draws: int = 2000) -> dict:
    """One configuration against itself: each round's MTP off over its second run, their median
    and middle half, and `low_median`: how low, relative to its own figure, a median of that
    many such rounds falls one time in 20 (a seeded bootstrap over them). Two identical runs
    differ only by the machine, so a bar whose figure is within that of what it needs is not
    decided by the run."""
    ratios = [a / b for a, b in zip(trials["MTP off"], trials[AGAIN])]
    centre = statistics.median(ratios)
    if len(ratios) < NOISE_ROUNDS:
        return {"ratios": ratios, "median": centre, "middle_half": middle_half(ratios), "low_median": None}
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return {"ratios": ratios, "median": centre, "middle_half": middle_half(ratios), "low_median": medians[draws // 20] / centre}


def verdict(bar: dict) -> str:
    if bar["met"]:
        return "yes"
    if "inside_noise" in bar and bar["inside_noise"] is None:  # a bar of rounds, too few to measure the noise
        return "NO, noise not measured"
    return "NO, inside the noise" if bar.get("inside_noise") else "NO"


def record_lengths(configs: dict, names: list) -> dict:
    """Wrap the named configurations so that each run's cycles per number of guesses is kept
    (name -> one per run, in the order run): what an adaptive run drafted, for reading its
    figure (a slow round, or a round whose text led it to draft where drafting did not pay)."""
    lengths = {name: [] for name in names}

    def recorded(name, run):
        def go():
            result = run()
            lengths[name].append(result["cycles_by_g"])
            return result
        return go

    for name in names:
        configs[name] = recorded(name, configs[name])
    return lengths


def fixed_lengths(setup) -> list:
    """The fixed g the bars time at each acceptance (the sweep's g among them)."""
    return sorted({*setup.args.fixed_lengths, setup.g})


def print_loop_efficiency(loop: dict, g: int, median: float, rounds: int) -> None:
    print(f"\nLoop efficiency at a = 1, g = {g}: {median:.2f}, the median of {rounds} rounds. In a middle round, "
          f"a cycle alone takes {loop['device_ms']:.2f} ms on the device, "
          f"{loop['loop_ms']:.2f} ms per cycle in the loop: {loop['efficiency']:.2f}; cycles launched pre-built "
          f"{100 * loop['prebuilt_share']:.0f}%, exposed host time {loop['exposed_host_ms']:.2f} ms per cycle; the host "
          f"built each cycle in {loop['build_ms']:.2f} ms, launched it in {loop['launch_ms']:.2f} ms and waited "
          f"{loop['waited_ms']:.2f} ms in its sync")


def judged_bars(setup, trials: dict, costs: list, efficiency: list, sweep_entries: list, best: dict,
                low_median: float) -> list:
    """Each bar's figure (the median of its rounds, with their middle half) against what it
    needs; a bar of rounds missed by less than the noise reaches (`noise`) says so."""
    g, acceptances = setup.g, setup.args.acceptance

    def paired(a, b, predicted=None):
        """Each round's a / b (over that round's prediction, if given: a list of one per round)."""
        predicted = predicted or [1.0] * len(trials[a])
        return [x / y / p for x, y, p in zip(trials[a], trials[b], predicted)]

    floors = [("MTP off >= 0.95 x mlx-lm", paired("MTP off", "mlx-lm"), 0.95)]
    if 1.0 in acceptances:
        floors += [(f"a = 1, g = {g}: measured >= 0.85 x E/(R+C)",
                    paired(f"g = {g}, a = 1", beside(1.0), [expected_tokens(1.0, g) / cost for cost in costs]), 0.85),
                   ("copy: free (lookup) guesses > MTP guesses, adaptive", paired("copy (free guesses), adaptive", "adaptive, a = 1"), 1.0),
                   (f"a = 1, g = {g}: loop efficiency >= 0.93", [e["efficiency"] for e in efficiency], 0.93)]
    if 0.0 in acceptances:
        floors += [(f"a = 0, g = {g}: measured >= 0.9 x 1/(R+C)", paired(f"g = {g}, a = 0", beside(0.0), [1 / cost for cost in costs]), 0.9),
                   ("a = 0: adaptive >= 0.97 x MTP off", paired("adaptive, a = 0", beside(0.0)), 0.97)]
    floors += [(f"a = {a:g}: adaptive >= 0.95 x the best of MTP off and every fixed g (chosen from the other rounds; "
                f"over all of them, {best[a]})",
                against_held_out_best(trials, f"adaptive, a = {a:g}", candidates(setup, a)), 0.95) for a in acceptances]
    # A bar on what the loop counted, not timed: no noise in it.
    counted = [("pre-built share >= 0.95 at every acceptance, g = 6 and adaptive",
                min(min(x["prebuilt_share"], x["adaptive_prebuilt_share"]) for x in sweep_entries), 0.95)]
    # A bar on a figure that must stay low: met when the worst case is at most the bound.
    ceilings = [("exposed host ms per cycle <= 0.3 at every acceptance, g = 6 and adaptive",
                 [max(max(x["exposed_host_ms"], x["adaptive_exposed_host_ms"]) for x in sweep_entries)], 0.3)]
    # A bar is the median of its rounds; the middle half of them shows how far this machine's
    # noise reaches, so that a miss inside it reads as what it is.
    measured = ([judged_floor(b, v, need, low_median) for b, v, need in floors]
                + [{"bar": b, "ratio": v, "middle_half": (v, v), "needed": need, "met": v >= need} for b, v, need in counted]
                + [{"bar": b, "value": v[0], "at_most": most, "met": v[0] <= most} for b, v, most in ceilings])
    # Beside each adaptive bar, the figure against the best over every round (the reference the
    # rounds it is judged on chose, biased upward: `against_held_out_best`), so both are read.
    for a in acceptances:
        bar = next(b for b in measured if b["bar"].startswith(f"a = {a:g}: adaptive >= 0.95 x the best"))
        bar["in_sample_ratio"] = statistics.median(paired(f"adaptive, a = {a:g}", best[a]))
    return measured


def judged_floor(bar: str, rounds: list, needed: float, low_median: float) -> dict:
    """A bar of rounds that must reach `needed`: the median of its rounds, their middle half,
    and whether a miss lies inside the machine's noise (`noise`'s `low_median`)."""
    figure = statistics.median(rounds)
    return {"bar": bar, "ratio": figure, "middle_half": middle_half(rounds), "needed": needed,
            "met": figure >= needed, "inside_noise": None if low_median is None else needed * low_median <= figure < needed}


def beside(a: float) -> str:
    """The MTP off run timed among acceptance `a`'s runs."""
    return f"MTP off, a = {a:g}"


def candidates(setup, a: float) -> list:
    """What the adaptive length at acceptance `a` is set against: MTP off (timed beside it) and
    every fixed g."""
    return [beside(a), *(f"g = {n}, a = {a:g}" for n in fixed_lengths(setup))]


def against_held_out_best(trials: dict, name: str, rivals: list) -> list:
    """Each round's `name` over the rival that the other rounds' medians rank first.

    The best of nine medians taken from the very rounds it is judged on is biased upward: where
    rivals lie a few percent apart, the one whose rounds the machine favoured wins, so the
    reference is the best config plus its luck. Chosen from the other rounds, the choice owes
    nothing to the round it is set against (leave-one-out). A single round has no others: it is
    set against its own best."""
    rounds = range(len(trials[name]))

    def chosen(held_out):
        others = [i for i in rounds if i != held_out] or [held_out]
        return max(rivals, key=lambda rival: statistics.median(trials[rival][i] for i in others))

    return [trials[name][i] / trials[chosen(i)][i] for i in rounds]


def interleaved_rounds(configs: dict, trials: int, best_of: int, timed_alone: str, alone_ms, begin_round, done):
    """Run every configuration `best_of` times in each of `trials` rounds, the order turning
    round every pass: a machine whose speed drifts within a round, or a run that is faster for
    coming first, then favours neither side of a pair. Returns (runs: name -> [round][pass]
    result's tok/s, the loop efficiency of `timed_alone` in each round, the R + C that
    `begin_round(trial)` times as it starts each round)."""
    runs = {name: [] for name in configs}
    efficiency = []  # device time of a cycle alone / wall time per cycle in the loop
    costs = []  # for the prediction bars: timed beside the runs they predict
    for trial in range(trials):
        costs.append(begin_round(trial))
        for name in configs:
            runs[name].append([])
        timed = []  # (a cycle alone, the loop's run) for each pass of the round
        for turn in range(best_of):
            forward = (trial * best_of + turn) % 2 == 0
            for name, run in list(configs.items())[:: 1 if forward else -1]:
                # A cycle alone is timed just before and just after the loop, and the two averaged:
                # on a shared host, the speed drifts between measurements taken apart.
                before = alone_ms() if name == timed_alone else None
                result = run()
                runs[name][-1].append(result["tps"])
                if name == timed_alone:
                    timed.append(((before + alone_ms()) / 2, result))
        done(trial)
        if not timed:
            continue
        # Each side at its fastest pass, as the tok/s (`fastest_of`).
        alone = min(ms for ms, _ in timed)
        loop = min((run for _, run in timed), key=lambda run: run["ms_per_cycle"])
        efficiency.append({"device_ms": alone, "loop_ms": loop["ms_per_cycle"], "efficiency": alone / loop["ms_per_cycle"],
                           **{key: loop[key] for key in ("prebuilt_share", "exposed_host_ms", "build_ms", "launch_ms", "waited_ms")}})
    return runs, efficiency, costs


def fastest_of(tps: list) -> float:
    """A round's figure for one configuration: its fastest run. Whatever else the machine does
    only ever slows a run down, so the fastest of runs taken close together is the nearest to
    what the configuration itself costs (timeit's minimum, for the same reason). It narrows the
    spread where the machine's slow spells are short; where they last longer than a round, as
    on this project's VM at times, it narrows it a little (docs/benchmarks.md)."""
    return max(tps)


def middle_half(values) -> tuple:
    """The first and third quartiles (both the value itself for a single one)."""
    if len(values) < 2:
        return (values[0], values[0])
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q1, q3)
