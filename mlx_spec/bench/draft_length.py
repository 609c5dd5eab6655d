"""The best draft length is measured, not guessed: for g = 0..8, tok/s, acceptance, R_g, C_g and
the predicted speed-up E / (R_g + C_g) (E: tokens per cycle as measured) and the loop efficiency
(the cycles' device time measured alone / wall time), per workload.

    mlx-spec bench draft-length --model mlx-community/gemma-4-e2b-it-4bit \
        --drafter mlx-community/gemma-4-E2B-it-assistant-bf16
    mlx-spec bench draft-length --random-weights --shape small
"""

import sys

from .common import Progress, arguments, header, machine, markdown, parse, write_json
from ..decoding.limits import MAX_DRAFT_TOKENS
from .checks import at_least, known_names, whole_numbers
from .models import build_engine, describe_models
from .prefills import Prefills
from .runs import (
    QUICK_WORKLOADS,
    SAMPLING,
    TEMPLATE,
    cost_ratios,
    loop_efficiency,
    run_ours,
    warm_up,
    workload_names,
    workloads,
)


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench draft-length")
    parser.add_argument("--sampling", default="greedy", choices=sorted(SAMPLING),
                        help="greedy, or Gemma's default sampling (gemma) [greedy]")
    parser.add_argument("--max-g", type=at_least(0, MAX_DRAFT_TOKENS), default=8, help="measure g = 0 to this [8]")
    parser.add_argument("--lengths", type=whole_numbers(0, MAX_DRAFT_TOKENS), default=None, help="the g measured, comma separated [0 to --max-g]")
    parser.add_argument("--max-tokens", type=at_least(1), default=None, help="cap every workload's length")
    parser.add_argument("--workloads", type=known_names(workload_names()), default=None, help="comma separated names (default: all)")
    argv = sys.argv[1:] if argv is None else list(argv)
    quick = dict(max_tokens=12, workloads=QUICK_WORKLOADS)
    if not any(a == "--max-g" or a.startswith("--max-g=") for a in argv):
        quick["lengths"] = "0,1,3,6"  # (a --max-g given measures 0 to it, as without --quick)
    args = parse(parser, argv, quick=quick)
    engine = build_engine(args)
    info = machine()
    settings = SAMPLING[args.sampling]
    # g = 0 always: the measured speed-ups are over it, as the predicted ones are
    lengths = sorted({0} | set(args.lengths)) if args.lengths else list(range(args.max_g + 1))
    results = {"machine": info, "models": describe_models(args), "sampling": args.sampling, **TEMPLATE, "workloads": []}
    print(header("Draft length", info, {"sampling": args.sampling, **results["models"], **TEMPLATE}))
    names = args.workloads.split(",") if args.workloads else None
    chosen = workloads(engine, names)
    prefills = Prefills(engine)
    progress = Progress("draft-length", len(chosen) * len(lengths))
    for name, prompt, max_tokens in chosen:
        max_tokens = min(max_tokens, args.max_tokens or max_tokens)
        warm_up(engine, prompt, settings, prefills=prefills)
        one_ms, ratios = cost_ratios(engine, prompt, lengths, args.repeats, prefills)
        rows, entries, base = [], [], None
        for g in lengths:
            # The MTP drafter alone (no prompt lookup): its cost C_g and its acceptance are the table's
            run = run_ours(engine, prompt, settings, max_tokens, mtp=g > 0, draft_tokens=g, lookup=False, prefills=prefills)
            progress.step(f"{name}, g = {g}")
            base = base or run["tps"]
            r, c = ratios[g]["R"], ratios[g]["C"]
            predicted = run["tokens_per_cycle"] / (r + c)
            acceptance = run["kept"] / run["drafted"] if run["drafted"] else 0.0
            efficiency = loop_efficiency(engine, prompt, run, engine.mtp_drafter, prefills=prefills)
            entry = {"g": g, "tps": run["tps"], "acceptance": acceptance, "tokens_per_cycle": run["tokens_per_cycle"],
                     "R": r, "C": c, "predicted_speedup": predicted, "measured_speedup": run["tps"] / base if base else 0.0,
                     "loop_efficiency": efficiency}
            entries.append(entry)
            rows.append([g, f"{run['tps']:.1f}", f"{100 * acceptance:.0f}%", f"{run['tokens_per_cycle']:.2f}",
                         f"{r:.2f}", f"{c:.2f}", f"{predicted:.2f}x", f"{entry['measured_speedup']:.2f}x", f"{efficiency:.2f}"])
        best = max(entries, key=lambda e: e["tps"])
        results["workloads"].append({"workload": name, "one_position_ms": one_ms, "by_g": entries, "best_g": best["g"]})
        print(f"### {name} (one target position: {one_ms:.2f} ms)\n")
        print(markdown(["g", "tok/s", "acceptance", "tokens/cycle", "R_g", "C_g", "predicted E/(R+C)", "measured", "loop efficiency"], rows))
        print(f"\nBest g: {best['g']} ({best['tps']:.1f} tok/s)\n")
    print(f"JSON: {write_json('draft_length', args, results)}")


if __name__ == "__main__":
    main()
