"""Several requests at once: total and per-request tokens per second at 1, 2, 4 and 8
concurrent requests of mixed prompt and answer lengths, for mlx-spec's default (each request
drafting its own guesses inside the batch), mlx-spec with MTP off and at fixed draft lengths
(`--fixed-g`), and mlx-lm's own batched decoding (`BatchGenerator`, no drafts) on the same model and prompts, all in one run; the same
requests one after another (mlx-spec's default, alone each); and what a batch step costs by
rows and positions, from which the acceptance drafting needs to pay at each batch size.

The configurations run in interleaved rounds (`--rounds`, the order turned every round, so that
a machine whose speed drifts slows every side alike); each figure is the median over the rounds,
each ratio the median of the rounds' ratios, shown with their middle half. The bars: at every
batch size the default at least as fast as MTP off and as mlx-lm, both batched, and, where
guesses are kept (`--acceptance`), as the fastest fixed length; and 8 requests at once at least
3x the same 8 one after another.

    mlx-spec bench batch --random-weights --shape small
"""

import statistics

from ..decoding.draft_lengths import DraftLengths
from . import batch_trace
from .batch_runs import controlled_drafters, recorded, requests, timed_mlx_lm, timed_one_after_another, timed_ours
from .checks import acceptances, at_least, length_range, whole_numbers
from .common import Progress, arguments, header, machine, markdown, parse, write_json
from .models import build_engine, describe_models
from .runs import first_difference

CONCURRENCY = "1,2,4,8"
G = 6  # the fixed draft length whose step cost the cost table sets against a plain step
BEST = "default / best fixed g"  # the ratio against the fixed length (--fixed-g) fastest in its run


def configs(fixed) -> tuple:
    """The configurations timed: the default, MTP off, each fixed draft length, mlx-lm, one after another."""
    return ("default", "mtp_off", *(f"g = {g}" for g in fixed), "mlx_lm", "one_after_another")


def ratios(best: int) -> dict:
    """Each ratio's name -> the configuration the default is set against."""
    return {"default / off": "mtp_off", "default / mlx-lm": "mlx_lm", "default / one after another": "one_after_another",
            BEST: f"g = {best}"}


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench batch")
    parser.add_argument("--concurrency", type=whole_numbers(1), default=CONCURRENCY, help=f"requests at once, comma separated [{CONCURRENCY}]")
    parser.add_argument("--prompt-tokens", type=length_range, default="32,384", help="prompt lengths drawn from this range [32,384]")
    parser.add_argument("--answer-tokens", type=length_range, default="48,160", help="answer lengths drawn from this range [48,160]")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds of every configuration [3]")
    parser.add_argument("--acceptance", type=acceptances, default=None,
                        help="controlled guesses: each request's own MTP off answer, each position kept at these "
                             "chances, comma separated, while the real assistant runs [the real drafter's guesses]")
    parser.add_argument("--fixed-g", type=whole_numbers(1), default=str(G),
                        help=f"fixed draft lengths the default is set against (the best of them), comma separated [{G}]")
    parser.add_argument("--trace", action="store_true",
                        help="record the default's steps: where its time goes, steps with guesses against plain ones")
    args = parse(parser, argv, quick=dict(concurrency="1,4", prompt_tokens="16,96", answer_tokens="16,48", rounds=1))
    levels, prompt_range, answer_range = args.concurrency, args.prompt_tokens, args.answer_tokens
    engine = build_engine(args).with_stop_tokens([])  # every answer runs its whole budget
    info = machine()
    pool = requests(engine, max(levels), prompt_range, answer_range)
    print(header("Several requests at once", info, {"concurrency": levels, "prompt": prompt_range, "rounds": args.rounds,
                                                     "answer": answer_range, **describe_models(args)}))
    points = args.acceptance or [None]
    progress = Progress("batch", len(points) * len(levels) * args.rounds)
    rows = []
    for a in points:
        if a is not None:  # an engine that has served content of this acceptance, not the last one's
            engine.draft_lengths = DraftLengths(lockstep=engine.lockstep)
        drafters = controlled_drafters(engine, pool, a)
        rows += [measure(engine, pool[:c], progress, c, args.rounds, args.trace, drafters and drafters[:c], a, args.fixed_g)
                 for c in levels]
    results = {"machine": info, "models": describe_models(args), "levels": rows, "rounds": args.rounds,
               "step_ms": engine.draft_lengths.table(),
               "probe_extra_ms": engine.draft_lengths.probe_table(), "bars": judged(rows)}
    print_tables(rows, results["bars"])
    if args.trace:
        batch_trace.print_summary([{**r, "label": label(r)} for r in rows])
    print(f"\nJSON: {write_json('batch', args, results)}")


def measure(engine, batch, progress, c: int, rounds: int, trace: bool = False, drafters=None, acceptance=None,
            fixed=(G,)) -> dict:
    """Every configuration over these requests at once, in interleaved rounds. `drafters`: each
    request's controlled drafter at `acceptance` (None: the real drafter's guesses); `fixed`:
    the fixed draft lengths run beside the default."""
    # A short untimed run of each configuration first: the compiled functions of this batch size
    # (the pass of each length, the acceptance of each draft) are traced out of the figures.
    short = [(prompt, min(n, 8)) for prompt, n in batch]
    for settings in (dict(), dict(mtp=False), *(dict(draft_tokens=g) for g in fixed)):
        timed_ours(engine, short, drafters, **settings)
    timed_mlx_lm(engine, short)
    steps = []  # the default's, recorded by the cost model (--trace)
    timed = {"default": lambda: recorded(engine, steps if trace else None, lambda: timed_ours(engine, batch, drafters)),
             "mtp_off": lambda: timed_ours(engine, batch, mtp=False),
             **{f"g = {g}": (lambda g=g: timed_ours(engine, batch, drafters, draft_tokens=g)) for g in fixed},
             "mlx_lm": lambda: timed_mlx_lm(engine, batch),
             "one_after_another": lambda: timed_one_after_another(engine, batch, drafters),
             # The prompts alone (each answer one token): the same passes in every configuration,
             # so what the batch can gain is in the rest (on a CPU, where a prompt's pass is
             # compute-bound, they are a large part of a run).
             "prompts": lambda: timed_ours(engine, [(prompt, 1) for prompt, _ in batch])}
    runs = {k: [] for k in timed}
    for r in range(rounds):
        for k in list(timed)[:: 1 if r % 2 == 0 else -1]:
            runs[k].append(timed[k]())
        progress.step(f"{c} at once, round {r + 1}" + ("" if acceptance is None else f", a = {acceptance:g}"))
    first = {k: v[0] for k, v in runs.items()}
    off = first["mtp_off"]["tokens"]
    ours = [k for k in configs(fixed) if k not in ("mtp_off", "mlx_lm")]
    row = {"concurrency": c, "acceptance": acceptance, "fixed_g": list(fixed),
           "same_tokens": {k: first[k]["tokens"] == off for k in (*ours, "mlx_lm")}}
    # Where one of ours parts from MTP off (a batched matmul may round differently on Metal):
    # the request, the token's index and the logit gap there, never hidden.
    row["differences"] = {k: parted(engine, batch, first[k]["tokens"], off) for k in ours}
    for k in configs(fixed):
        row[k] = {f: statistics.median(run[f] for run in runs[k]) for f in ("total_tps", "per_request_tps", "first_token_s", "seconds")}
        row[k]["generated"] = first[k]["generated"]
        row[k]["rounds_tps"] = [run["total_tps"] for run in runs[k]]
        if "drafted" in first[k]:  # ours, batched: the guesses of its first round, and those kept
            row[k]["drafted"], row[k]["kept"] = first[k]["drafted"], first[k]["kept"]
    row["best_fixed_g"] = max(fixed, key=lambda g: row[f"g = {g}"]["total_tps"])
    row["ratios"] = {name: spread([a["total_tps"] / b["total_tps"] for a, b in zip(runs["default"], runs[other])])
                     for name, other in ratios(row["best_fixed_g"]).items()}
    row["prompts_s"] = statistics.median(run["seconds"] for run in runs["prompts"])
    # One after another over the default, each less the prompts' time of its round.
    row["ratios"]["decoding: default / one after another"] = spread([
        (b["seconds"] - p["seconds"]) / (a["seconds"] - p["seconds"])
        for a, b, p in zip(runs["default"], runs["one_after_another"], runs["prompts"])])
    row["step_cost"] = step_cost(engine, c)
    if trace:
        row["trace"] = batch_trace.summary(steps)
    return row


def spread(values: list) -> dict:
    """The median of the rounds' values and their middle half."""
    if len(values) < 2:
        return {"median": values[0], "middle_half": [values[0], values[0]], "rounds": values}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "middle_half": [q1, q3], "rounds": values}


def judged(rows) -> list:
    """The bars: the default at least as fast as MTP off and mlx-lm, batched, at every batch size
    (with controlled guesses, at least 0.97 of MTP off where none is kept, and at least the best
    fixed g where some are); 8 at once at least 3x one after another."""
    bars = []
    for r in rows:
        a = r.get("acceptance")
        needs = [("default / off", 0.97 if a == 0 else 1.0), ("default / mlx-lm", 1.0)]
        if a:
            needs.append((BEST, 1.0))
        if r["concurrency"] == 8:
            needs.append(("default / one after another", 3.0))
        for name, need in needs:
            ratio = r["ratios"][name]
            named = f"{name} (g = {r['best_fixed_g']})" if name == BEST else name
            bars.append({"bar": f"{label(r)} at once: {named} >= {need:g}", "ratio": ratio["median"],
                         "middle_half": ratio["middle_half"], "needed": need, "met": ratio["median"] >= need})
    return bars


def label(row) -> str:
    """A row's batch size, and its controlled acceptance where it has one."""
    a = row.get("acceptance")
    return str(row["concurrency"]) if a is None else f"{row['concurrency']} (a = {a:g})"


def parted(engine, batch, tokens, reference) -> list:
    """(request, token index, logit gap) for each request whose greedy tokens part from the reference's."""
    out = []
    for i, (prompt, _) in enumerate(batch):
        where = first_difference(engine, prompt, tokens[i], reference[i]) if tokens[i] != reference[i] else None
        if where is not None:
            out.append((i, *where))
    return out


def step_cost(engine, rows: int) -> dict:
    """T(B, G + 1) / T(B, 1) from the engine's cost model, and the acceptance a at which G
    guesses pay for it: 1 + a + ... + a^G = that ratio (None where it was not timed)."""
    seconds = engine.draft_lengths.seconds
    plain, drafting = seconds.get((rows, 1)), seconds.get((rows, G + 1))
    probe = engine.draft_lengths.probe_extra.get((rows, 2))  # a probe of one guess, between plain steps
    probe_cost = None if probe is None or not plain else probe / plain
    if not plain or not drafting:
        return {"ratio": None, "break_even": None, "probe": probe_cost}
    ratio = drafting / plain
    low, high = 0.0, 1.0
    for _ in range(40):  # E(a) is increasing in a: bisect
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid ** i for i in range(G + 1)) < ratio else (low, mid)
    return {"ratio": ratio, "break_even": high if ratio <= G + 1 else None, "probe": probe_cost}


def same_tokens(row) -> str:
    """'yes', or which runs parted from MTP off where (request, token index, logit gap)."""
    if all(row["same_tokens"].values()):
        return "yes"
    parts = [f"{k}: {', '.join(f'request {i} at {n} (gap {gap:.2g})' for i, n, gap in row['differences'].get(k, []))}"
             if row["differences"].get(k) else k for k, same in row["same_tokens"].items() if not same]
    return "no: " + "; ".join(parts)


def print_tables(rows, bars) -> None:
    table, fixed = [], rows[0]["fixed_g"]
    for r in rows:
        d, off, lm, seq = r["default"], r["mtp_off"], r["mlx_lm"], r["one_after_another"]
        table.append([label(r), f"{d['total_tps']:.1f}", f"{off['total_tps']:.1f}",
                      *(f"{r[f'g = {g}']['total_tps']:.1f}" for g in fixed), f"{lm['total_tps']:.1f}", f"{seq['total_tps']:.1f}",
                      *(f"{r['ratios'][name]['median']:.2f}" for name in ratios(0)),
                      f"{r['best_fixed_g']}", f"{d['per_request_tps']:.1f}", same_tokens(r)])
    print(markdown(["at once", "default tok/s", "MTP off", *(f"g = {g}" for g in fixed), "mlx-lm batched",
                    "one after another", *ratios(0), "best fixed g", "per request (default)", "same tokens"], table))
    print("\nThe prompts alone (every answer one token) and what the batch gains on the rest:\n")
    print(markdown(["at once", "prompts alone (s)", "default run (s)", "one after another (s)",
                    "decoding: default / one after another"],
                   [[label(r), f"{r['prompts_s']:.2f}", f"{r['default']['seconds']:.2f}",
                     f"{r['one_after_another']['seconds']:.2f}",
                     f"{r['ratios']['decoding: default / one after another']['median']:.2f}"] for r in rows]))
    print("\nTotal tok/s: every token over the wall time from the moment all the requests were sent (prompts "
          "included); per request: each request's tokens after its first over its own time from first to last. "
          "Each the median of the rounds; each ratio the median of the rounds' ratios.")
    if not all(r["same_tokens"]["mlx_lm"] for r in rows):
        print("mlx-lm's greedy tokens differ: it takes the argmax of log-probs rounded to the model's dtype, which "
              "flips near-ties (random weights' logits are flat; docs/benchmarks.md). Ours are the same with and "
              "without drafting and batching.")
    print("\nWhere drafting pays, from the step costs the batch measured (T(B, L): B rows, L positions):\n")
    cost = [[label(r)] + ["-" if r["step_cost"].get(k) is None else f"{r['step_cost'][k]:.2f}"
                                  for k in ("ratio", "break_even", "probe")] for r in rows]
    print(markdown(["rows", f"T(B, {G + 1}) / T(B, 1)", f"acceptance needed for g = {G} to pay",
                    "a probe of one guess between plain steps: its extra / T(B, 1)"], cost))
    print("\n" + markdown(["bar", "figure", "middle half of the rounds", "met"],
                          [[b["bar"], f"{b['ratio']:.2f}", "{:.2f}-{:.2f}".format(*b["middle_half"]), "yes" if b["met"] else "NO"]
                           for b in bars]))
