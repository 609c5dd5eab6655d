"""Controlled acceptance: what the loop itself costs, on any machine, without real weights.

The real drafter runs (its cost is real), but its guesses are replaced by the target's own
greedy continuation, each broken with probability 1 - a. For a = 0 ... 1 the measured speed-up
over MTP off (a run of it beside each acceptance) is printed next to the prediction
E / (R_g + C_g), E = 1 + a + ... + a^g, for a fixed g and for the adaptive draft length; MTP off
is measured next to mlx-lm on the same model and prompt; and a copy (guesses that cost nothing,
as prompt lookup's) is set against MTP's.

The bars (controlled_bars.py) are medians over interleaved rounds of each round's ratio, among
them the adaptive length against the best of MTP off and every fixed g at each acceptance.

    mlx-spec bench controlled --random-weights --shape small
"""

from dataclasses import dataclass

from .common import Progress, arguments, header, machine, markdown, parse, write_json
from ..decoding.limits import MAX_DRAFT_TOKENS
from .checks import acceptances, at_least, whole_numbers
from .models import build_engine, describe_models
from .prefills import Prefills
from .controlled_bars import bars
from .runs import SAMPLING, ControlledDrafter, cost_ratios, expected_tokens, run_mlx_lm, run_ours, warm_up

ACCEPTANCE = "0,0.3,0.5,0.7,0.9,1"
FIXED_LENGTHS = "1,2,3,4,5,6,7,8"  # the fixed g the adaptive length is set against at each acceptance


@dataclass
class Setup:
    """What every part of the run shares: the engine, the prompt, MTP off's tokens (every
    controlled run must give them) and the settings."""

    args: object
    engine: object
    prompt: list
    reference: list  # the prompt and MTP off's continuation: the guesses the controlled drafter breaks
    off_tokens: list
    g: int
    prefills: Prefills
    greedy: object = SAMPLING["greedy"]
    # Which positions a controlled drafter finds predictable (its seed): the sweep's text is
    # seed 0; each round of the bars draws its own (controlled_bars.py).
    text_seed: int = 0

    def controlled(self, a, draft_tokens, inner="mtp"):
        inner = self.engine.mtp_drafter if inner == "mtp" else inner
        drafter = ControlledDrafter(inner, self.reference, self.engine.target.vocab_size, a, seed=self.text_seed)
        run = run_ours(self.engine, self.prompt, self.greedy, self.args.max_tokens, drafter=drafter,
                       draft_tokens=draft_tokens, prefills=self.prefills)
        assert run["tokens"] == self.off_tokens, "controlled drafting changed the output"
        return run

    def mtp_off(self):
        return run_ours(self.engine, self.prompt, self.greedy, self.args.max_tokens, mtp=False, prefills=self.prefills)

    def mlx_lm(self):
        return run_mlx_lm(self.engine, self.prompt, self.greedy, self.args.max_tokens, stop=False)


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench controlled")
    parser.add_argument("--draft-tokens", type=at_least(1, MAX_DRAFT_TOKENS), default=6, help="g of the sweep [6]")
    parser.add_argument("--prompt-tokens", type=at_least(1), default=256, help="the prompt's length [256]")
    parser.add_argument("--max-tokens", type=at_least(1), default=200, help="tokens per run [200]")
    parser.add_argument("--trials", type=at_least(1), default=7, help="interleaved rounds for the bars")
    parser.add_argument("--best-of", type=at_least(1), default=1,
                        help="runs of each configuration in a round, of which the round takes the fastest [1]")
    parser.add_argument("--acceptance", type=acceptances, default=ACCEPTANCE, help=f"the sweep's acceptances, comma separated [{ACCEPTANCE}]")
    parser.add_argument("--fixed-lengths", type=whole_numbers(1, MAX_DRAFT_TOKENS), default=FIXED_LENGTHS,
                        help=f"fixed g timed at each acceptance for the bars, comma separated [{FIXED_LENGTHS}]")
    # Quick: one round, shorter runs, three acceptances and every other fixed length (a few
    # minutes on MLX's CPU backend, where a cycle of the small shape takes a quarter second).
    args = parse(parser, argv, quick=dict(prompt_tokens=64, max_tokens=24, trials=1, acceptance="0,0.5,1",
                                          fixed_lengths="2,4,6,8"))
    args.fixed_lengths = sorted(set(args.fixed_lengths))
    cycle = max(*args.fixed_lengths, args.draft_tokens) + 1  # the most tokens a cycle settles
    if args.max_tokens <= cycle:  # a run's rate leaves out its first cycle (runs.rate)
        parser.error(f"argument --max-tokens: must be more than a cycle of the longest draft ({cycle - 1} guesses "
                     f"and the target's token), at least {cycle + 1}; got {args.max_tokens}")
    # The reference continuation runs the full length: stop tokens would end it (and every
    # controlled run with it) wherever the model writes one.
    engine = build_engine(args).with_stop_tokens([])
    if engine.mtp_drafter is None:
        raise SystemExit("controlled acceptance runs the real drafter: give --drafter or --random-weights")
    info = machine()
    g, greedy = args.draft_tokens, SAMPLING["greedy"]
    import numpy as np

    prompt = np.random.default_rng(0).integers(0, engine.target.vocab_size, args.prompt_tokens).tolist()
    prefills = Prefills(engine)
    warm_up(engine, prompt, greedy, prefills=prefills)
    one_ms, ratios = cost_ratios(engine, prompt, [0, g], args.repeats, prefills)
    r, c = ratios[g]["R"], ratios[g]["C"]
    anchor = run_mlx_lm(engine, prompt, greedy, args.max_tokens, stop=False)
    off = run_ours(engine, prompt, greedy, args.max_tokens, mtp=False, prefills=prefills)
    setup = Setup(args, engine, prompt, prompt + off["tokens"], off["tokens"], g, prefills)
    results = {"machine": info, "models": describe_models(args), "g": g, "prompt_tokens": len(prompt),
               "max_tokens": args.max_tokens, "one_position_ms": one_ms, "R": r, "C": c,
               "mlx_lm_tps": anchor["tps"], "mtp_off_tps": off["tps"], "sweep": []}
    shown = {"g": g, "prompt": len(prompt), "tokens": args.max_tokens, "acceptances": "/".join(f"{a:g}" for a in args.acceptance),
             "fixed lengths": "/".join(map(str, args.fixed_lengths)), "trials": args.trials, "best of": args.best_of}
    print(header("Controlled acceptance", info, {**shown, **results["models"]}))
    print(f"One target position: {one_ms:.2f} ms; R_{g} = {r:.2f}; C_{g} = {c:.2f}\n")
    print(markdown(["", "tok/s", "ratio"], [["mlx-lm " + anchor["how"], f"{anchor['tps']:.1f}", "1.00"],
                                             ["ours, MTP off", f"{off['tps']:.1f}", f"{off['tps'] / anchor['tps']:.2f}"]]))
    print()
    progress = Progress("controlled", len(args.acceptance) + args.trials)
    results["sweep"] = sweep(setup, r + c, progress)
    results.update(bars(setup, results["sweep"], progress))
    print(f"\nJSON: {write_json('controlled', args, results)}")


def sweep(setup: Setup, cost: float, progress) -> list:
    """g = `setup.g` and the adaptive length at each acceptance, beside MTP off: one row each."""
    g, entries, rows = setup.g, [], []
    for a in setup.args.acceptance:
        # Each acceptance's speed-ups are over an MTP off run measured beside it, not over the
        # one above: on a shared machine the speed drifts by a quarter within minutes.
        beside = setup.mtp_off()
        run = setup.controlled(a, g)
        adaptive = setup.controlled(a, None)
        progress.step(f"acceptance {a}")
        predicted = expected_tokens(a, g) / cost
        # The same cost model fed the tokens per cycle this run actually drew: what is left
        # between it and the measurement is the loop's own cost, not the dice.
        modelled = run["tokens_per_cycle"] / cost
        measured = run["tps"] / beside["tps"]
        entries.append({"acceptance": a, "tps": run["tps"], "mtp_off_tps": beside["tps"],
                        "tokens_per_cycle": run["tokens_per_cycle"],
                        "predicted_speedup": predicted, "modelled_speedup": modelled,
                        "measured_speedup": measured, "measured_over_predicted": measured / predicted,
                        "measured_over_modelled": measured / modelled, "adaptive_tps": adaptive["tps"],
                        "adaptive_speedup": adaptive["tps"] / beside["tps"],
                        "adaptive_cycles_by_g": adaptive["cycles_by_g"], "prebuilt_share": run["prebuilt_share"],
                        "exposed_host_ms": run["exposed_host_ms"], "waited_ms": run["waited_ms"],
                        "build_ms": run["build_ms"], "launch_ms": run["launch_ms"],
                        "adaptive_prebuilt_share": adaptive["prebuilt_share"],
                        "adaptive_exposed_host_ms": adaptive["exposed_host_ms"], "adaptive_waited_ms": adaptive["waited_ms"]})
        rows.append([a, f"{beside['tps']:.1f}", f"{run['tps']:.1f}", f"{expected_tokens(a, g):.2f}", f"{run['tokens_per_cycle']:.2f}",
                     f"{predicted:.2f}x", f"{modelled:.2f}x", f"{measured:.2f}x", f"{measured / predicted:.2f}",
                     f"{measured / modelled:.2f}", f"{100 * run['prebuilt_share']:.0f}%", f"{run['exposed_host_ms']:.2f}",
                     f"{run['waited_ms']:.2f}", f"{run['build_ms']:.2f} / {run['launch_ms']:.2f}", f"{adaptive['tps']:.1f}", f"{adaptive['tps'] / beside['tps']:.2f}x",
                     f"{100 * adaptive['prebuilt_share']:.0f}%", f"{adaptive['exposed_host_ms']:.2f}"])
    print(markdown(["acceptance", "MTP off tok/s", f"g={g} tok/s", "E", "tokens/cycle drawn", "predicted E/(R+C)", "with drawn tokens/cycle",
                    "measured", "measured / predicted", "measured / with drawn", "pre-built", "exposed host ms/cycle",
                    "host waited ms/cycle", "host build / launch ms/cycle", "adaptive tok/s", "adaptive speed-up", "adaptive pre-built",
                    "adaptive exposed ms/cycle"], rows))
    return entries


if __name__ == "__main__":
    main()
