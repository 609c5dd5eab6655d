"""The target split over a group of processes (models/gemma4/tensor_parallel.py): tok/s, the
all-reduces a cycle runs and the bytes each rank sends per token, for the pair alone and split
over --ranks processes of MLX's ring backend on this machine (localhost, started by the real
`mlx.launch`), MTP off, a fixed g and the adaptive length, in interleaved rounds, with a check
that every run gives the same tokens split as alone; then the cost model for the 31B over
Thunderbolt 5 (group_cost.py).

The local figures are functional: the ranks share this machine's cores and talk over
loopback TCP. They show what a split costs in collectives, not what two Macs gain.

    mlx-spec bench group --model TARGET --drafter DRAFTER
    mlx-spec bench group --random-weights --shape small
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import List, Optional

from .common import Progress, TableSkipped, arguments, header, machine, markdown, parse, write_json
from .checks import at_least
from .group_cost import LINK_GBPS, table
from .models import describe_models

RUNS = {"MTP off": {"mtp": False}, "g = 3": {"draft_tokens": 3, "lookup": False}, "adaptive": {}}
# One thread of math per rank: the ranks share the machine's cores.
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench group")
    parser.add_argument("--ranks", type=at_least(2), default=2, help="processes the target is split over [2]")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (alone, split) [3]")
    parser.add_argument("--prompt-tokens", type=at_least(1), default=128, help="the prompt's length [128]")
    parser.add_argument("--max-tokens", type=at_least(1), default=64, help="tokens per run [64]")
    args = parse(parser, argv, quick=dict(rounds=1, prompt_tokens=24, max_tokens=16))
    launcher = find_launcher()
    if launcher is None:
        raise TableSkipped(f"the group table needs MLX's launcher, mlx.launch, and found it in none of "
                           f"{', '.join(launcher_places())}; it comes with mlx: pip install mlx "
                           f"(into the environment of {sys.executable})")
    settings = {"random_weights": args.random_weights, "shape": args.shape, "model": args.model,
                "drafter": args.drafter, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                "runs": RUNS}
    info = machine()
    models = describe_models(args)
    print(header("A target split over a group of processes", info,
                 {"ranks": args.ranks, "backend": "ring (localhost)", "prompt": args.prompt_tokens,
                  "tokens": args.max_tokens, "rounds": args.rounds, **models}))
    progress = Progress("group", args.rounds)
    rounds = []
    for i in range(args.rounds):
        rounds.append({"alone": run(settings, 1), "split": run(settings, args.ranks, launcher)})
        progress.step(f"round {i + 1}")
    rows, records = summary(rounds, args.ranks)
    print(markdown(["run", "alone tok/s", f"{args.ranks} ranks tok/s", "split / alone", "all-reduces per cycle",
                    "KB sent per token per rank", "same tokens"], rows))
    moved = logits_moved(rounds)
    for r in rounds:  # (a vocabulary's floats per run: the JSON keeps what they showed)
        r["alone"].pop("first_logits"), r["split"].pop("first_logits")
    print(f"\nLogits after the prompt, split against alone: largest change {moved['max_abs_change']:.3g}; gap "
          f"between the two likeliest tokens alone {moved['top2_gap_alone']:.3g} (same argmax: "
          f"{'yes' if moved['same_argmax'] else 'NO'}). Where an answer differs, the split's order of sums moved a "
          "near-tie (bf16 weights round each partial sum); in float32 the tests find every token equal.")
    print(f"\nMedian of {args.rounds} interleaved rounds. All-reduces counted in a short answer with compilation "
          "off (each is then a Python call), per cycle, the prompt's passes included; a rank of a ring sends "
          f"2 (N - 1) / N of each all-reduce's payload.\n")
    headers, cost_rows, cost_records = table()
    print(f"Predicted: Gemma 4 31B in bf16 on Macs linked by Thunderbolt 5 ({LINK_GBPS} Gb/s) with JACCL "
          "(mlx_spec/bench/group_cost.py: its model, assumptions and sources)\n")
    print(markdown(headers, cost_rows))
    print(f"\nJSON: {write_json('group', args, {'machine': info, 'models': models, 'ranks': args.ranks, 'runs': records, 'logits': moved, 'rounds': rounds, 'predicted_31b': cost_records})}")


def launcher_places() -> List[str]:
    """Where MLX's launcher may be, in the order looked: beside the interpreter running us (a
    venv or pipx called by its path puts nothing on the PATH), where pip put mlx's own scripts
    (a venv over the system's packages), then the PATH."""
    places = [str(Path(sys.executable).parent / "mlx.launch")]
    try:
        mlx = metadata.distribution("mlx")
        places += [str(Path(mlx.locate_file(file)).resolve()) for file in mlx.files or () if Path(str(file)).name == "mlx.launch"]
    except metadata.PackageNotFoundError:  # (mlx installed some other way: no record of its scripts)
        pass
    return list(dict.fromkeys(places)) + ["the PATH"]


def find_launcher() -> Optional[str]:
    """The first mlx.launch of launcher_places() that can be run, else None."""
    for place in launcher_places()[:-1]:
        if os.path.isfile(place) and os.access(place, os.X_OK):
            return place
    return shutil.which("mlx.launch")


def run(settings: dict, ranks: int, launcher: Optional[str] = None) -> dict:
    """One worker run (bench/group_rank.py): alone, or under `launcher` (mlx.launch) over `ranks`
    processes."""
    worker = [sys.executable, "-m", "mlx_spec.bench.group_rank", json.dumps(settings)]
    command = worker
    if ranks > 1:
        command = [launcher, "--backend", "ring", "-n", str(ranks)]
        for name, value in THREADS.items():
            command += ["--env", f"{name}={value}"]
        command += worker
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **THREADS}, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"the {'group' if ranks > 1 else 'single'} run printed no result:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def summary(rounds, ranks: int):
    rows, records = [], []
    for name in RUNS:
        alone = statistics.median(r["alone"]["runs"][name]["tps"] for r in rounds)
        split = statistics.median(r["split"]["runs"][name]["tps"] for r in rounds)
        last = rounds[-1]["split"]["runs"][name]
        differs = [where_they_part(r["alone"]["runs"][name]["tokens"], r["split"]["runs"][name]["tokens"]) for r in rounds]
        first = min((d for d in differs if d is not None), default=None)
        sent = last["payload_bytes_per_token"] * 2 * (ranks - 1) / ranks
        rows.append([name, f"{alone:.1f}", f"{split:.2f}", f"{split / alone:.3f}", f"{last['per_cycle']:.1f}",
                     f"{sent / 1e3:.1f}", "yes" if first is None else f"from token {first}"])
        records.append({"run": name, "alone_tps": alone, "split_tps": split, "all_reduces_per_cycle": last["per_cycle"],
                        "bytes_sent_per_token_per_rank": sent, "same_tokens": first is None, "first_difference": first,
                        "kept": last["kept"], "drafted": last["drafted"]})
    return rows, records


def where_they_part(a, b):
    """The first token where two answers differ (None: they are the same; runs.first_difference
    also gives the logit gap there, but needs the model, which ran in the workers)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def logits_moved(rounds) -> dict:
    """How far the split moves the logits after the prompt: the largest change, and the gap
    between the two likeliest tokens alone (a change larger than the gap can swap them)."""
    alone, split = rounds[-1]["alone"]["first_logits"], rounds[-1]["split"]["first_logits"]
    top = sorted(alone, reverse=True)
    return {"max_abs_change": max(abs(x - y) for x, y in zip(alone, split)), "top2_gap_alone": top[0] - top[1],
            "same_argmax": alone.index(top[0]) == split.index(max(split))}
