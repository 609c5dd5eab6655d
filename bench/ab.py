"""Two revisions of mlx-spec in one run: the loop at controlled acceptance, old and new, in
interleaved rounds on the same model, prompt and machine.

Each revision runs in a worker process of its own, importing its own `mlx_spec` and bench code
(the base revision is exported from git into a temporary folder). The driver asks the two
workers for the same run in turn (old then new, then new then old, ...), so a machine whose
speed drifts slows both alike, and reports per run the median over the rounds of new / old
tok/s.

    python bench/ab.py --base HEAD~1 --random-weights --shape small
    python bench/ab.py --base HEAD~1 --model /path/to/target --drafter /path/to/assistant
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# The worker: loads the model as the revision's own benchmarks do, then answers one line per
# request ("<acceptance> <g or adaptive>") with the run's figures as one JSON line.
WORKER = r"""
import json, sys
# An editable install of mlx-spec (pip install -e) puts a finder ahead of sys.path that maps
# every `mlx_spec.*` to the checkout it was installed from, submodules included: without this,
# the base revision's worker imported the working tree's benchmarks beside its own loop.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
import numpy as np
try:  # the benchmarks inside the package (since `mlx-spec bench`), or a revision's bench/ before
    from mlx_spec.bench.common import arguments
    from mlx_spec.bench.models import Engine, build_engine
    from mlx_spec.bench.runs import SAMPLING, ControlledDrafter, run_ours, warm_up
except ImportError:
    from common import Engine, arguments, build_engine
    from runs import SAMPLING, ControlledDrafter, run_ours, warm_up

args = arguments("ab worker").parse_args(sys.argv[1:-2])
prompt_tokens, max_tokens = int(sys.argv[-2]), int(sys.argv[-1])
loaded = build_engine(args)
# The same pair without stop tokens: the reference continuation runs the full length.
if hasattr(loaded, "with_stop_tokens"):
    engine = loaded.with_stop_tokens([])
else:  # a revision before the engine was split into its parts
    engine = Engine(loaded.target, loaded.assistant, loaded.tokenizer, stop_tokens=[])
greedy = SAMPLING["greedy"]
prompt = np.random.default_rng(0).integers(0, engine.target.vocab_size, prompt_tokens).tolist()
warm_up(engine, prompt, greedy)
off = run_ours(engine, prompt, greedy, max_tokens, mtp=False)
reference = prompt + off["tokens"]
# Every module of ours this worker runs, for the driver to check they are its revision's.
ours = sorted(m.__file__ for name, m in list(sys.modules.items())
              if (name == "mlx_spec" or name.startswith("mlx_spec.") or name in ("common", "runs")) and getattr(m, "__file__", None))
print(json.dumps({"ready": True, "modules": ours}), flush=True)
for line in sys.stdin:
    a, g = line.split()
    if g == "off":
        run = run_ours(engine, prompt, greedy, max_tokens, mtp=False)
    else:
        drafter = ControlledDrafter(engine.mtp_drafter, reference, engine.target.vocab_size, float(a))
        run = run_ours(engine, prompt, greedy, max_tokens, drafter=drafter, draft_tokens=None if g == "adaptive" else int(g))
    assert run["tokens"] == off["tokens"], "controlled drafting changed the output"
    print(json.dumps({k: run.get(k) for k in ("tps", "prebuilt_share", "exposed_host_ms", "cycles")}), flush=True)
"""


class Worker:
    def __init__(self, root: Path, model_args: list, prompt_tokens: int, max_tokens: int):
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, *model_args, str(prompt_tokens), str(max_tokens)],
            cwd=root / "bench", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**__import__("os").environ, "PYTHONPATH": f"{root}:{root / 'bench'}"},
        )
        self.check(root, self.read()["modules"])

    @staticmethod
    def check(root: Path, modules: list) -> None:
        """Each revision's worker must run its own code, not an installed copy of mlx-spec."""
        stray = [m for m in modules if not Path(m).resolve().is_relative_to(root.resolve())]
        if stray:
            raise SystemExit(f"the worker for {root} imported modules from elsewhere: {', '.join(stray[:3])}")

    def read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended early (exit {self.process.wait()})")
        return json.loads(line)

    def run(self, acceptance: float, g: str) -> dict:
        self.process.stdin.write(f"{acceptance} {g}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def export(revision: str, into: Path) -> Path:
    """The files of `revision` in a folder of their own (no git bookkeeping)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the old revision (git)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", default="0.5:6,0.7:6,0:adaptive,0:off",
                        help="comma-separated acceptance:g (g a number, 'adaptive' or 'off')")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--out", default=None, help="JSON output file [bench/results/ab.json]")
    args, model_args = parser.parse_known_args()
    sys.path.insert(0, str(ROOT))
    from mlx_spec.bench.common import header, machine  # the working tree's own: this machine, named as every bench does

    info = machine()
    runs = [tuple(r.split(":")) for r in args.runs.split(",")]
    with tempfile.TemporaryDirectory(prefix="mlx-spec-base-") as folder:
        base = export(args.base, Path(folder))
        workers = {"old": Worker(base, model_args, args.prompt_tokens, args.max_tokens),
                   "new": Worker(ROOT, model_args, args.prompt_tokens, args.max_tokens)}
        figures = {(a, g, side): [] for a, g in runs for side in workers}
        for round_ in range(args.rounds):
            for a, g in runs:
                # Old first in even rounds, new first in odd ones: whatever the run before leaves
                # behind (a warm cache, a busy core) falls on both alike.
                order = list(workers.items()) if round_ % 2 == 0 else list(workers.items())[::-1]
                for side, worker in order:
                    figures[(a, g, side)].append(worker.run(float(a), g))
        for worker in workers.values():
            worker.close()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(header("Two revisions side by side", info, {"base": args.base, "new": f"the working tree at {head}",
                                                        "model": " ".join(model_args), "rounds": args.rounds,
                                                        "prompt": args.prompt_tokens, "tokens": args.max_tokens}))
    print("| acceptance | g | old tok/s | new tok/s | new / old (median of rounds) | old pre-built, exposed ms | new pre-built, exposed ms |")
    print("|---|---|---|---|---|---|---|")
    out = []
    for a, g in runs:
        old, new = figures[(a, g, "old")], figures[(a, g, "new")]
        ratio = statistics.median(n["tps"] / o["tps"] for n, o in zip(new, old))

        def med(side, key):
            return statistics.median(r[key] or 0.0 for r in side)

        out.append({"acceptance": float(a), "g": g, "old": old, "new": new, "ratio": ratio})
        print(f"| {a} | {g} | {med(old, 'tps'):.1f} | {med(new, 'tps'):.1f} | {ratio:.3f} | "
              f"{100 * med(old, 'prebuilt_share'):.0f}%, {med(old, 'exposed_host_ms'):.2f} | "
              f"{100 * med(new, 'prebuilt_share'):.0f}%, {med(new, 'exposed_host_ms'):.2f} |")
    path = Path(args.out) if args.out else HERE / "results" / "ab.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": info, "base": args.base, "head": head, "model": model_args, "runs": out}, indent=1))
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
