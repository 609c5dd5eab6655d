"""`mlx-spec bench`: the seed's tables measured on this machine, from the installed package.

Each table is a module with `main(argv)`: `positions` (the 1-vs-N-position cost), `acceptance`
(guesses kept per kind of content, mlx-lm beside), `draft-length` (tok/s by g with the cost
model's prediction), `controlled` (the loop's own cost at set acceptances), `overhead` (the
host's cost of building a cycle), `media` (an image in the prompt: first token, encoder, MTP),
`batch` (several requests at once, mlx-lm's BatchGenerator beside), `group` (the target split
over processes with mlx.launch, and a cost model for Macs over Thunderbolt) and `rollback` (a
Gated DeltaNet layer's rollback: replay against a state kept per position) and `structured`
(answers held to a JSON schema or a regex, drafting on and off, mlx-lm beside). `run` writes a
table's JSON and markdown into the results folder and (re)draws the report there; `run_all`
runs every table (`--skip A,B` leaves some out) into one folder and ends with a block to paste
into an issue.
"""

import contextlib
import importlib
import io
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

from ..errors import SettingsError
from . import report
from .common import TableSkipped, results_folder

TABLES = {"positions": "positions", "acceptance": "acceptance", "draft-length": "draft_length",
          "controlled": "controlled", "overhead": "overhead", "media": "media", "batch": "batch", "group": "group",
          "rollback": "rollback", "structured": "structured"}
# The options every table takes: what `all` passes to each; and those `all` passes to the tables
# that have them only.
SHARED = {"--model": 1, "--drafter": 1, "--random-weights": 0, "--shape": 1, "--repeats": 1, "--quick": 0, "--out": 1}
ROUTED = {"--workloads": ("acceptance", "draft-length")}


class _Tee(io.TextIOBase):
    """Standard output as it is, and a copy: the table's markdown file."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def with_folder(argv: Sequence[str]) -> List[str]:
    """argv with --out set (a dated folder under the current directory unless given)."""
    argv = list(argv)
    if "--out" not in argv and not any(a.startswith("--out=") for a in argv):
        argv += ["--out", str(results_folder(None))]
    return argv


def folder_of(argv: Sequence[str]) -> Path:
    for i, arg in enumerate(argv):
        if arg == "--out":
            return Path(argv[i + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    raise ValueError("no --out in the arguments")


def run(table: str, argv: Sequence[str], draw: bool = True) -> Path:
    """One table into its folder (JSON, markdown) and, with `draw`, the report; returns the folder."""
    if table not in TABLES:
        raise SettingsError(f"unknown table {table!r}; the tables are {', '.join(TABLES)}, and all")
    argv = with_folder(argv)
    module = importlib.import_module(f".{TABLES[table]}", __name__)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        module.main(argv)
    folder = folder_of(argv)
    table_file = folder / f"{TABLES[table]}.md"
    table_file.write_text(tee.copy.getvalue())
    print(f"Markdown: {table_file}")  # (after the copy: the file does not name itself)
    if draw:
        _draw(folder)
    return folder


def _draw(folder: Path, missing: Optional[Dict[str, "Missing"]] = None) -> None:
    written = report.write(folder, {table: f"{why.kind}: {why.reason}" for table, why in (missing or {}).items()})
    print(f"Report: {written}" + ("" if report.have_plots() else f" (tables only; {report.PLOTS_MISSING})"))


def run_all(argv: Sequence[str]) -> Path:
    """Every table (but those `--skip TABLE,...` names), one after the other, into one folder;
    then the block to paste."""
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: mlx-spec bench all [--skip TABLE,...] [{' | '.join(SHARED)}] [--workloads NAME,...]\n\n"
              "Every table, one after the other, into one folder (--out, else a dated one here), then a block to "
              f"paste into an issue. The tables: {', '.join(TABLES)}. The options go to every table (--workloads to "
              "acceptance and draft-length); a table's own: mlx-spec bench TABLE --help.")
        raise SystemExit(0)
    argv, skipped = without_skip(with_folder(argv))
    unknown = [a for a in argv if a.startswith("--") and a.split("=")[0] not in {**SHARED, **ROUTED}]
    if unknown:
        raise SettingsError(f"`mlx-spec bench all` takes {', '.join({**SHARED, **ROUTED})} and --skip; "
                         f"give {unknown[0]} to one table instead")
    tables = [table for table in TABLES if table not in skipped]
    start, missing, stopped = time.perf_counter(), {}, False
    for i, table in enumerate(tables, 1):
        print(f"\n# [{i}/{len(tables)}] {table} ({time.perf_counter() - start:.0f} s so far)\n", file=sys.stderr)
        try:
            missing.update(_attempt(table, _for_table(table, argv)))  # the report is drawn once, at the end
        except KeyboardInterrupt:  # (Ctrl-C: the tables done are kept and drawn, then the stop goes on)
            missing[table], stopped = Missing("stopped", "Ctrl-C while it ran"), True
            break
    folder = folder_of(argv)
    folder.mkdir(parents=True, exist_ok=True)  # (where every table was skipped, none made it)
    _draw(folder, missing)
    print("\n" + summary(folder, [t for t in tables if t not in missing], missing))
    failed = {table: why for table, why in missing.items() if why.kind == "failed"}
    if stopped:
        raise KeyboardInterrupt
    if failed:
        raise SystemExit(f"mlx-spec bench all: {len(failed)} of {len(tables)} tables failed (the report holds the "
                         f"others): " + "; ".join(f"{table}: {why.reason}" for table, why in failed.items()))
    return folder


class Missing(NamedTuple):
    """Why a table of `all` has no figures in this run: skipped (it cannot run on this install),
    failed or stopped, and the reason as the table gave it."""

    kind: str
    reason: str


def _attempt(table: str, argv: Sequence[str]) -> Dict[str, Missing]:
    """One table of `all`; {} when it wrote its figures, else {table: why not}. A table that
    fails is named and the run goes on to the others."""
    try:
        run(table, argv, draw=False)
    except TableSkipped as skipped:
        print(f"mlx-spec bench all: {table} skipped: {skipped}", file=sys.stderr)
        return {table: Missing("skipped", str(skipped))}
    except SystemExit as ended:
        if ended.code in (0, None):
            return {}
        why = str(ended.code).strip()
    except Exception as error:  # (a bug in a table: its traceback, and the other tables still run)
        traceback.print_exc()
        why = f"{type(error).__name__}: {error}"
    else:
        return {}
    print(f"mlx-spec bench all: {table} failed: {why}", file=sys.stderr)
    return {table: Missing("failed", why)}


def without_skip(argv: List[str]):
    """argv without `--skip A,B` (or `--skip=A,B`), and the tables it names (each checked)."""
    rest, skipped, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--skip" or arg.startswith("--skip="):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            skipped += [name.strip() for name in value.split(",") if name.strip()]
            continue
        rest.append(arg)
        i += 1
    for name in skipped:
        if name not in TABLES:
            raise SettingsError(f"--skip: unknown table {name!r}; the tables are {', '.join(TABLES)}")
    return rest, set(skipped)


def _for_table(table: str, argv: Sequence[str]) -> List[str]:
    """argv without the routed options the table does not take (an option and its value)."""
    out, skip = [], False
    for arg in argv:
        name = arg.split("=")[0]
        if skip:
            skip = False
        elif name in ROUTED and table not in ROUTED[name]:
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def summary(folder: Path, ran: Sequence[str] = tuple(TABLES), missing: Optional[Dict[str, Missing]] = None) -> str:
    """A short block for an issue or a discussion: the machine, the headline ratios, the report;
    from the tables `ran` (a folder given again with --out may hold others, from an earlier run,
    which the block names as such), with a line for each table `missing` from this run."""
    import json

    def load(name):
        file = folder / f"{name}.json"
        return json.loads(file.read_text()) if file.is_file() else None

    tables = {module: load(module) if table in ran else None for table, module in TABLES.items()}
    first = next((t for t in tables.values() if t), None)
    lines = ["```", "mlx-spec bench"]
    earlier = [table for table, module in TABLES.items() if table not in ran and (folder / f"{module}.json").is_file()]
    if earlier:
        lines.append(f"(in the report from an earlier run, not this one: {', '.join(earlier)})")
    for table, why in (missing or {}).items():
        lines.append(f"{table}: {why.kind}: {why.reason.splitlines()[0] if why.reason else ''}")
    if first:
        m = first["machine"]
        lines.append(f"machine: {m['chip']}, {m['memory_gb']} GB, {m['os']}, "
                     + (f"mlx-spec {m['mlx_spec']}, " if "mlx_spec" in m else "")
                     + f"mlx {m['mlx']} ({m['device']}), mlx-lm {m['mlx_lm']}, mlx-vlm {m.get('mlx_vlm') or 'not installed'}")
        models = first.get("models") or {}
        if models:
            lines.append(f"models: {models.get('target')} + {models.get('drafter')}")
    if tables["positions"]:
        rows = tables["positions"]["target"]
        context = min(r["context"] for r in rows)
        seven = next((r["ratio"] for r in rows if r["context"] == context and r["positions"] == 7), None)
        if seven:
            lines.append(f"7 positions / 1 at context {context}: {seven:.2f} (seed, M5: 1.25)")
    if tables["acceptance"]:
        if tables["acceptance"].get("mlx_vlm"):  # why mlx-vlm's columns are empty
            lines.append(f"mlx-vlm: {tables['acceptance']['mlx_vlm']}")
        for r in tables["acceptance"]["runs"]:
            lines.append(f"{r['workload']} ({r['sampling']}): MTP g=6 {r['speedup']:.2f}x, default "
                         f"{r['default']['tps'] / r['mtp_off']['tps'] if r['mtp_off']['tps'] else 0:.2f}x over MTP off; "
                         f"kept {r['mtp_on']['kept']}/{r['mtp_on']['drafted']}; "
                         f"mlx-lm {r['mlx_lm']['tps']:.1f} tok/s; same tokens: {r['same_tokens']}"
                         + (f"; mlx-spec g=6 / mlx-vlm MTP {r['mtp_on']['tps'] / r['mlx_vlm']['tps']:.2f}x"
                            if r.get("mlx_vlm", {}).get("tps") else ""))
    if tables["controlled"]:
        for point in tables["controlled"]["sweep"]:
            if point["acceptance"] in (0.5, 1.0):
                lines.append(f"controlled a = {point['acceptance']}: {point['measured_speedup']:.2f}x measured, "
                             f"{point['predicted_speedup']:.2f}x predicted")
    lines += [f"report: {folder / 'report.html'}", "```"]
    return "\n".join(lines)
