"""Shared pieces of the benchmarks: the options, the machine, timing and the output (the models
are `models.py`'s)."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx

from ..loading import AUTO
from .blas import blas_library, matmul_gflops
from .checks import at_least, not_a_file

SHAPES = ["e2b", "e4b", "26b-a4b", "31b", "12b", "small", "qwen3.5-0.8b", "qwen3.6-27b", "qwen3.6-35b-a3b"]
# Memory bandwidth of Apple chips in GB/s (docs/design.md, section 5).
APPLE_BANDWIDTH = {"M1": 68, "M2": 100, "M3": 100, "M4": 120, "M5": 153, "M5 Pro": 307, "M5 Max": 614}


class TableSkipped(SystemExit):
    """A table that cannot run on this install, for a reason its message names: `bench all`
    notes it in the report and goes on; a table run alone exits with the message."""


def arguments(description: str, prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, prog=prog)
    parser.add_argument("--model", default=None,
                        help="target: e2b|e4b|26b-a4b|31b|12b (4-bit MLX), hub id or folder [e2b]")
    parser.add_argument("--drafter", default=AUTO, help="drafter: auto (the target's assistant), size name, hub id or folder")
    parser.add_argument("--random-weights", action="store_true", help="a real shape, random weights, 4-bit")
    parser.add_argument("--shape", choices=SHAPES, default="e2b", help="shape for --random-weights")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="timed repeats (the median is reported)")
    parser.add_argument("--quick", action="store_true",
                        help="a run of a few minutes with the shape of every table (fewer contexts, tokens, repeats)")
    parser.add_argument("--out", type=not_a_file, default=None,
                        help="folder for the results (JSON, markdown, report.html) [./mlx-spec-bench-<date and time>]")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]], quick: dict) -> argparse.Namespace:
    """The arguments, with `quick`'s values as the defaults under --quick (what is given still wins)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--quick" in argv:
        parser.set_defaults(repeats=2, **quick)
    args = parser.parse_args(argv)
    args.out = str(results_folder(args.out))
    return args


def results_folder(out: Optional[str]) -> Path:
    """Where the results go: the folder given, else a dated one under the current directory
    (never inside the installed package)."""
    return Path(out) if out else Path.cwd() / time.strftime("mlx-spec-bench-%Y%m%d-%H%M%S")


def machine() -> dict:
    """What the figures were measured on."""
    chip = platform.processor() or platform.machine()
    if sys.platform == "darwin":
        chip = _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or chip
    elif os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                chip = line.split(":", 1)[1].strip()
                break
    import mlx_lm

    try:
        from importlib.metadata import version

        mlx_vlm = version("mlx-vlm")
    except Exception:  # not installed: the peer is skipped
        mlx_vlm = None
    return {
        "chip": chip,
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "os": platform.platform(),
        "mlx_spec": mlx_spec_version(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "mlx_vlm": mlx_vlm,
        "device": str(mx.default_device()),
        "metal": bool(mx.metal.is_available()),
        "blas": blas_library(),
        "matmul_gflops": round(matmul_gflops(), 1),
    }


def mlx_spec_version() -> str:
    """This package's version, and its commit when it runs from a git checkout (with
    '+changes' when the checkout has uncommitted ones): figures are compared across commits."""
    from pathlib import Path

    from .. import __version__

    root = Path(__file__).resolve().parents[2]
    top = _run(["git", "-C", str(root), "rev-parse", "--show-toplevel"])
    if not top or Path(top).resolve() != root:  # installed, not a checkout (perhaps inside another's)
        return __version__
    root = str(root)
    commit = _run(["git", "-C", root, "rev-parse", "--short", "HEAD"])
    changed = _run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"])
    return f"{__version__} ({commit}{'+changes' if changed else ''})"


def _run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def chip_bandwidth(chip: str):
    """The chip's memory bandwidth in GB/s if it is a known Apple chip, else None."""
    name = chip.replace("Apple ", "")
    return APPLE_BANDWIDTH.get(name)


# -- timing and output -------------------------------------------------------------------------


class Progress:
    """A progress bar on standard error for one table: what runs, how far along, time left (from
    the pace so far). Standard output keeps the tables alone."""

    def __init__(self, table: str, total: int, width: int = 24):
        self.table, self.total, self.width = table, max(total, 1), width
        self.done, self.start = 0, time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"{self.table} [{bar}] {self.done}/{self.total} {what}: {elapsed:.0f} s, about {left:.0f} s left"
        if sys.stderr.isatty():  # (one line, rewritten; to a file or a pipe, a line each, no escapes)
            sys.stderr.write(f"\r{line}\x1b[K" + ("\n" if self.done >= self.total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def median_ms(fn, repeats: int, warmup: int = 2) -> float:
    """Median wall time of `fn()` in milliseconds; fn must evaluate what it computes."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def markdown(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(script: str, args, payload: dict) -> Path:
    folder = results_folder(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{script}.json"
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    return out


def header(title: str, machine_info: dict, settings: dict) -> str:
    """The table's title, the machine, the software, the model files and the settings."""
    m = machine_info
    settings = dict(settings)
    files = settings.pop("files", {})
    lines = [f"## {title}", "", f"Machine: {m['chip']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}",
             (f"mlx-spec {m['mlx_spec']}, " if "mlx_spec" in m else "")  # (older results have none)
             + f"mlx {m['mlx']} ({m['device']}), mlx-lm {m['mlx_lm']}, mlx-vlm {m.get('mlx_vlm') or 'not installed'}"]
    if "blas" in m:  # (results written before it was recorded have none)
        lines.append(f"BLAS: {m['blas']}, a 512 x 512 float32 product at {m['matmul_gflops']} GFLOP/s")
    for role, entries in files.items():
        named = [f"{e['file']} ({e['sha256'][:12]})" if "sha256" in e else f"{e['file']} ({e['error']})" for e in entries]
        lines.append(f"Files ({role}): " + ", ".join(named))
    lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    return "\n".join(lines)
