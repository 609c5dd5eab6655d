"""The 1-vs-N-position table: what one target pass over N new positions costs, next to one
position, at several context lengths; and what g drafter steps cost (C_g).

    mlx-spec bench positions --model mlx-community/gemma-4-e2b-it-4bit \
        --drafter mlx-community/gemma-4-E2B-it-assistant-bf16
    mlx-spec bench positions --random-weights              # E2B shapes, no download
    mlx-spec bench positions --random-weights --shape 31b  # or e4b, 26b-a4b, 12b: each size's shapes
    mlx-spec bench positions --random-weights --shape small  # for MLX on a CPU
"""

import mlx.core as mx

from ..decoding.sequence import SequenceState
from .checks import whole_numbers
from .common import (
    Progress,
    arguments,
    chip_bandwidth,
    header,
    machine,
    markdown,
    median_ms,
    parse,
    write_json,
)
from .models import build_engine, describe_models, weight_bytes_per_pass
from .one_row import as_row

POSITIONS = [1, 2, 3, 4, 5, 6, 7, 8, 16]
SEED_MS = {1: 56, 7: 70}  # the seed's figures: transformers on an Apple M5 (docs/design.md, section 5)


def prefilled(engine, context: int) -> SequenceState:
    """A sequence with `context` random tokens in the target's caches."""
    state = SequenceState(engine.target)
    tokens = mx.random.randint(0, engine.target.vocab_size, (context + 1,)).tolist()
    engine.decoder(mtp=False).add_tokens(state, tokens)
    return state


def time_target(row, n: int, vocab_size: int, repeats: int) -> float:
    """One pass of the loop over n new positions (the sequence as the loop's one row), fully
    evaluated (logits of all n), then cut back."""
    tokens = mx.random.randint(0, vocab_size, (1, n))

    def one_pass():
        mx.eval(row.pass_(tokens))
        row.cut(n)

    return median_ms(one_pass, repeats)


def time_drafter(engine, row, g: int, repeats: int) -> float:
    """g MTP draft steps over the target's caches, as the loop drafts a row, fully evaluated."""
    return median_ms(lambda: mx.eval(row.draft(engine.mtp_drafter, g)), repeats)


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench positions")
    parser.add_argument("--contexts", type=whole_numbers(1), default="128,1024,4096", help="context lengths, comma separated")
    args = parse(parser, argv, quick=dict(contexts="128,512"))
    engine = build_engine(args)
    info = machine()
    weight_bytes = weight_bytes_per_pass(engine.target)
    bandwidth = chip_bandwidth(info["chip"]) if info["metal"] else None
    contexts = args.contexts
    results = {"machine": info, "models": describe_models(args), "repeats": args.repeats,
               "weight_bytes_per_pass": weight_bytes, "target": [], "drafter": []}
    print(header("Target pass over N new positions", info, {"repeats": args.repeats, **results["models"]}))
    progress = Progress("positions", len(contexts) * len(POSITIONS) + (8 if engine.mtp_drafter is not None else 0))
    for context in contexts:
        with as_row(engine.target, prefilled(engine, context)) as row:
            one = table(engine, row, context, args, results, progress, bandwidth, weight_bytes)
            if engine.mtp_drafter is not None and context == contexts[0]:
                drafter_table(engine, row, context, one, args, results, progress)
    print(f"Weights read per target pass: {weight_bytes / 1e9:.3f} GB")
    print(f"JSON: {write_json('positions', args, results)}")


def table(engine, row, context, args, results, progress, bandwidth, weight_bytes) -> float:
    """The context's rows of the table; one position's time."""
    lines, one = [], None
    for n in POSITIONS:
        ms = time_target(row, n, engine.target.vocab_size, args.repeats)
        progress.step(f"context {context}, {n} positions")
        one = one or ms
        gbs = weight_bytes / ms / 1e6
        entry = {"context": context, "positions": n, "ms": ms, "ratio": ms / one, "gb_per_s": gbs}
        if bandwidth:
            entry["bandwidth_share"] = gbs / bandwidth
        results["target"].append(entry)
        lines.append([context, n, f"{ms:.2f}", f"{ms / one:.2f}", f"{gbs:.1f}",
                      f"{100 * gbs / bandwidth:.0f}%" if bandwidth else "-", SEED_MS.get(n, "")])
    print(markdown(["context", "positions", "ms", "ratio to 1", "weights GB/s", "of chip bandwidth", "seed ms (M5, transformers)"], lines))
    print()
    return one


def drafter_table(engine, row, context, one, args, results, progress) -> None:
    drows = []
    for g in range(1, 9):
        ms = time_drafter(engine, row, g, args.repeats)
        progress.step(f"{g} drafter steps")
        results["drafter"].append({"context": context, "steps": g, "ms": ms, "c_g": ms / one})
        drows.append([g, f"{ms:.2f}", f"{ms / one:.2f}"])
    print(f"Drafter steps at context {context} (C_g = their time / one target position)\n")
    print(markdown(["g", "ms", "C_g"], drows))
    print()


if __name__ == "__main__":
    main()
