"""The seed's acceptance table: four workloads (and a copy), with Gemma's default sampling and
greedy; tok/s without MTP, with MTP (6 guesses, as the seed), guesses kept, speed-up, mlx-spec's
default (adaptive draft length, prompt lookup + MTP), and mlx-lm on the same prompt as the anchor;
where mlx-vlm is installed, its MTP on the same prompt (asked for 6 guesses a round; its own rule
may draft fewer), and mlx-spec over it.
The loop efficiency of the g = 6 run: its cycles' device time, each measured alone, over its
wall time (1.0: the device never waited for the host).

    mlx-spec bench acceptance --model e4b   # any size by name (e2b, e4b, 26b-a4b, 31b, 12b) with its assistant
    mlx-spec bench acceptance --model mlx-community/gemma-4-e2b-it-4bit \
        --drafter mlx-community/gemma-4-E2B-it-assistant-bf16
    mlx-spec bench acceptance --random-weights --shape small   # runs anywhere; acceptance ~0
"""

from .common import Progress, arguments, header, machine, markdown, parse, write_json
from .checks import at_least, known_names
from .models import build_engine, describe_models
from .peers import open_peer
from .prefills import Prefills
from .runs import (
    QUICK_WORKLOADS,
    SAMPLING,
    TEMPLATE,
    agreement,
    first_difference,
    loop_efficiency,
    run_mlx_lm,
    run_ours,
    workload_names,
    warm_up,
    workloads,
)

# The seed's table: transformers on an Apple M5 (docs/design.md, section 6).
SEED = {
    "tool call": ("12.6", "40.9", "34/35"),
    "answer from tool result": ("13.0", "22.6", "42/106"),
    "English code": ("8.8", "11.6", "51%"),
    "long Chinese text": ("10.3", "10.3", "7%"),
}


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench acceptance")
    parser.add_argument("--sampling", type=known_names(SAMPLING), default="gemma,greedy", help="comma separated: gemma, greedy")
    parser.add_argument("--max-tokens", type=at_least(1), default=None, help="cap every workload's length")
    parser.add_argument("--workloads", type=known_names(workload_names()), default=None, help="comma separated names (default: all)")
    # Quick: short runs of three workloads with short prompts (each prompt's prefill, ours and
    # mlx-lm's, is most of a workload's time on a slow device).
    args = parse(parser, argv, quick=dict(max_tokens=12, workloads=QUICK_WORKLOADS))
    engine = build_engine(args)
    info = machine()
    names = args.workloads.split(",") if args.workloads else None
    results = {"machine": info, "models": describe_models(args), **TEMPLATE, "runs": []}
    print(header("Acceptance by kind of content", info, {**results["models"], **TEMPLATE}))
    chosen = workloads(engine, names)
    peer, why_not = open_peer(engine, args.random_weights)
    if why_not:
        print(f"{why_not}\n")
        results["mlx_vlm"] = why_not
    prefills = Prefills(engine)
    progress = Progress("acceptance", len(chosen) * len(args.sampling.split(",")))
    for sampling in args.sampling.split(","):
        settings = SAMPLING[sampling]
        rows = []
        for name, prompt, max_tokens in chosen:
            row, entry = measure(engine, name, prompt, min(max_tokens, args.max_tokens or max_tokens), sampling,
                                 prefills, peer)
            rows.append(row)
            results["runs"].append(entry)
            if "mlx_vlm_failed" in entry:  # once is enough: the rest of the table goes on without it
                print(entry["mlx_vlm_failed"] + "\n")
                results["mlx_vlm"], peer = entry["mlx_vlm_failed"], None
            progress.step(f"{name}, {sampling}")
        print(f"### Sampling: {sampling} ({settings.temperature} / {settings.top_k} / {settings.top_p})\n")
        print(markdown(["workload", "prompt", "tokens", "mlx-lm tok/s", "MTP off tok/s", "MTP (g=6) tok/s",
                        "guesses kept", "speed-up", "loop efficiency", "default tok/s", "default speed-up", "MTP on = off",
                        "off = mlx-lm", "mlx-vlm MTP tok/s", "mlx-vlm kept", "mlx-spec g=6 / mlx-vlm",
                        "mlx-spec default / mlx-vlm", "mlx-vlm = off", "seed off", "seed on", "seed kept"], rows))
        print()
    print(f"JSON: {write_json('acceptance', args, results)}")


def measure(engine, name, prompt, max_tokens, sampling, prefills, peer):
    """One workload at one sampling: MTP off, on (g = 6), the default, mlx-lm and mlx-vlm,
    with the checks on their tokens; its table row and JSON entry."""
    settings = SAMPLING[sampling]
    warm_up(engine, prompt, settings, prefills=prefills)
    off = run_ours(engine, prompt, settings, max_tokens, mtp=False, prefills=prefills)
    on = run_ours(engine, prompt, settings, max_tokens, draft_tokens=6, lookup=False,  # the seed's setup
                  prefills=prefills)
    default = run_ours(engine, prompt, settings, max_tokens, prefills=prefills)  # adaptive g, lookup + MTP
    anchor = run_mlx_lm(engine, prompt, settings, max_tokens)
    vlm, peer_failed = peer_run(peer, prompt, settings, max_tokens)
    vlm_same = _changed(engine, prompt, off["tokens"], [vlm["tokens"]], sampling, peer=True) if vlm else None
    kept = f"{on['kept']}/{on['drafted']} ({100 * on['kept'] / max(on['drafted'], 1):.0f}%)"
    # Exactness: with the same seed, drafting must not change a single token (greedy or
    # sampled). mlx-lm is shown for reference only: its greedy takes the argmax of
    # log-probs rounded to the model's dtype, which in bf16 can flip near-ties.
    same = _changed(engine, prompt, off["tokens"], [on["tokens"], default["tokens"]], sampling)
    # mlx-lm stops at its tokenizer's end tokens, which may not be ours: compared over
    # the common length then, and the column says so.
    like_mlx_lm = "-" if sampling != "greedy" else agreement(off["tokens"], anchor["tokens"])
    speedup = on["tps"] / off["tps"] if off["tps"] else 0.0
    efficiency = loop_efficiency(engine, prompt, on, engine.mtp_drafter, prefills=prefills)
    seed = SEED.get(name, ("", "", ""))
    row = [name, len(prompt), len(on["tokens"]), f"{anchor['tps']:.1f}", f"{off['tps']:.1f}",
           f"{on['tps']:.1f}", kept, f"{speedup:.2f}x", f"{efficiency:.2f}", f"{default['tps']:.1f}",
           f"{default['tps'] / off['tps'] if off['tps'] else 0:.2f}x", same, like_mlx_lm,
           *_peer_columns(on, default, vlm, vlm_same), *seed]
    strip = lambda r: {k: v for k, v in r.items() if k != "tokens"}  # noqa: E731
    entry = {"workload": name, "sampling": sampling, "prompt_tokens": len(prompt),
             "generated": len(on["tokens"]), "mlx_lm": strip(anchor), "mtp_off": strip(off),
             "mtp_on": strip(on), "default": strip(default), "speedup": speedup,
             "loop_efficiency": efficiency, "same_tokens": same, "same_as_mlx_lm": like_mlx_lm,
             **({"mlx_vlm": {**strip(vlm), "same_tokens": vlm_same}} if vlm else {}),
             **({"mlx_vlm_failed": f"mlx-vlm failed on {name}: {peer_failed}"} if peer_failed else {})}
    return row, entry


def peer_run(peer, prompt, settings, max_tokens):
    """(mlx-vlm's run, None), or (None, why it failed): a peer that fails on this pair leaves its
    columns empty, not the table unwritten."""
    if peer is None:
        return None, None
    try:
        peer.run(prompt, settings, 8)  # its first call's costs (its drafter's graphs, its samplers) out of the figures
        return peer.run(prompt, settings, max_tokens), None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def _changed(engine, prompt, off, others, sampling, peer=False) -> str:
    """"yes" where every output equals MTP off's; else where the first one parts from it. With
    greedy, Metal may round a 7-position pass and a 1-position pass differently: the first
    differing token and how close the two tokens' logits were there say whether it is a near tie.
    A peer samples with its own random numbers, so only its greedy output is compared."""
    if peer and sampling != "greedy":
        return "-"
    differing = next((o for o in others if o != off), None)
    if differing is None:
        return "yes"
    if sampling != "greedy":
        return "NO"
    where = first_difference(engine, prompt, off, differing)
    return f"NO (from token {where[0]}, logit gap {where[1]:.3g})" if where else "NO (lengths)"


def _peer_columns(on, default, vlm, vlm_same) -> list:
    """mlx-vlm's tok/s and guesses kept, mlx-spec (g = 6 and default) over it, its greedy output."""
    if vlm is None:
        return ["-"] * 5
    ratio = lambda ours: f"{ours / vlm['tps']:.2f}x" if vlm["tps"] else "-"  # noqa: E731
    return [f"{vlm['tps']:.1f}", f"{vlm['kept']}/{vlm['drafted']}", ratio(on["tps"]), ratio(default["tps"]), vlm_same]


if __name__ == "__main__":
    main()
