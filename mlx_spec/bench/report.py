"""The benchmark report: plots of every table a run wrote, in one HTML file that works offline
(the pictures are embedded), next to the JSON and markdown; each plot is also saved as a PNG
in `plots/`, for a README or an issue.

matplotlib is an optional extra (`pip install "mlx-spec[bench]"`); without it the report holds
the tables alone and says how to get the plots.
"""

import base64
import html
import io
import json
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Optional

PLOTS_MISSING = 'plots need matplotlib: pip install "mlx-spec[bench]"'


def write(folder: Path, missing: Optional[Dict[str, str]] = None) -> Path:
    """report.html in `folder`, from the tables' JSON and markdown found there; `missing` names
    the tables (as the command spells them) that wrote nothing in this run, and why."""
    folder = Path(folder)
    plot = _plotter()
    sections = []
    for table in FIGURES:  # (every table, in the report's order)
        why_not = (missing or {}).get(table.replace("_", "-"))
        data_file = folder / f"{table}.json"
        if not data_file.is_file():
            if why_not:
                sections.append(_section(table, [], "", f"Not in this run: {why_not}"))
            continue
        data = json.loads(data_file.read_text())
        text = (folder / f"{table}.md").read_text() if (folder / f"{table}.md").is_file() else ""
        images = [plot(title, draw, caption(data)) for title, draw in FIGURES[table](data)] if plot else []
        for i, (_, png) in enumerate(images, 1):
            (folder / "plots").mkdir(exist_ok=True)
            (folder / "plots" / f"{table}-{i}.png").write_bytes(base64.b64decode(png))
        sections.append(_section(table, images, text, why_not and (
            f"Not in this run: {why_not}. The figures below are from an earlier run into this folder.")))
    note = "" if plot else f"<p><b>{html.escape(PLOTS_MISSING)}</b></p>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>mlx-spec bench</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
img{{max-width:100%}} pre{{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}}</style></head>
<body><h1>mlx-spec bench</h1>{note}{''.join(sections)}</body></html>"""
    out = folder / "report.html"
    out.write_text(page)
    return out


def have_plots() -> bool:
    return _plotter() is not None


def _section(table: str, images: List[str], text: str, note: Optional[str] = None) -> str:
    pictures = "".join(f'<img alt="{html.escape(t)}" src="data:image/png;base64,{b}">' for t, b in images)
    said = f"<p><b>{html.escape(note)}</b></p>" if note else ""
    body = f"<pre>{html.escape(text)}</pre>" if text or images else ""
    return f"<h2>{html.escape(table.replace('_', ' '))}</h2>{said}{pictures}{body}"


def _plotter() -> Optional[Callable]:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        return None

    def plot(title: str, draw: Callable, note: str) -> tuple:
        figure, axes = plt.subplots(figsize=(7.5, 4.4))
        draw(axes)
        axes.set_title(title)
        figure.text(0.01, 0.005, note, fontsize=7, color="dimgrey")
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
        buffer = io.BytesIO()
        figure.tight_layout(rect=(0, 0.03, 1, 1))
        figure.savefig(buffer, format="png", dpi=110)
        plt.close(figure)
        return title, base64.b64encode(buffer.getvalue()).decode()

    return plot


def caption(data: dict) -> str:
    """What a plot was measured on: the machine, MLX's device and the target."""
    m, models = data.get("machine", {}), data.get("models") or {}
    target = models.get("target", "E2B's structure at narrow widths, random weights")
    blas = f", BLAS {m['blas'].split(' (')[0]}" if m.get("blas") and "cpu" in str(m.get("device")) else ""
    return f"{m.get('chip', '?')}, mlx {m.get('mlx', '?')} ({m.get('device', '?')}{blas}); target: {target}"


# -- one function per table: [(title, draw(axes)), ...] ----------------------------------------


def _positions(data: dict) -> list:
    def draw(ax):
        for context in sorted({r["context"] for r in data["target"]}):
            rows = [r for r in data["target"] if r["context"] == context]
            ax.plot([r["positions"] for r in rows], [r["ratio"] for r in rows], marker="o", label=f"context {context}")
        ax.axhline(1, color="grey", lw=0.8)
        ax.plot([7], [70 / 56], marker="*", ms=12, ls="", color="black", label="seed, M5 (7 vs 1: 70 / 56 ms)")
        ax.set_xlabel("new positions in one target pass")
        ax.set_ylabel("time / time of one position")

    return [("The cost of N positions against one", draw)]


def _acceptance(data: dict) -> list:
    runs = data["runs"]
    figures = []
    for sampling in dict.fromkeys(r["sampling"] for r in runs):
        chosen = [r for r in runs if r["sampling"] == sampling]

        def peers(ax, chosen=chosen):
            names = [r["workload"] for r in chosen]
            series = [("mlx-lm", lambda r: r["mlx_lm"]["tps"]), ("MTP off", lambda r: r["mtp_off"]["tps"]),
                      ("MTP g = 6", lambda r: r["mtp_on"]["tps"]), ("mlx-spec default", lambda r: r["default"]["tps"])]
            if any("mlx_vlm" in r for r in chosen):
                series.append(("mlx-vlm MTP", lambda r: r.get("mlx_vlm", {}).get("tps", 0)))
            width = 0.8 / len(series)
            for i, (label, value) in enumerate(series):
                ax.bar([j + i * width for j in range(len(names))], [value(r) for r in chosen], width, label=label)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=15, fontsize=8)
            ax.set_ylabel("tokens / s")

        def by_position(ax, chosen=chosen):
            for r in chosen:
                rates = position_acceptance(r["mtp_on"])
                ax.plot(range(1, len(rates) + 1), rates, marker="o", label=r["workload"])
            ax.set_xlabel("guess position in the cycle")
            ax.set_ylabel("share of cycles keeping it")
            ax.set_ylim(0, 1.05)

        figures += [(f"tok/s per workload ({sampling} sampling)", peers),
                    (f"Acceptance by guess position ({sampling} sampling, g = 6)", by_position)]
    return figures


def position_acceptance(run: dict) -> List[float]:
    """Per guess position i: the cycles that kept guess i over the cycles that drafted it."""
    drafted_at: Dict[int, int] = {}
    for g, cycles in run.get("cycles_by_g", {}).items():
        for i in range(1, int(g) + 1):
            drafted_at[i] = drafted_at.get(i, 0) + cycles
    kept = run.get("kept_by_position", [])
    return [kept[i - 1] / drafted_at[i] if drafted_at.get(i) else 0.0 for i in range(1, len(kept) + 1)]


def _draft_length(data: dict) -> list:
    def draw(ax):
        for workload in data["workloads"]:
            g = [e["g"] for e in workload["by_g"]]
            line, = ax.plot(g, [e["measured_speedup"] for e in workload["by_g"]], marker="o", label=workload["workload"])
            ax.plot(g, [e["predicted_speedup"] for e in workload["by_g"]], ls="--", color=line.get_color())
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xlabel("draft length g (dashed: predicted E / (R_g + C_g))")
        ax.set_ylabel("speed-up over g = 0")

    return [("Speed-up by draft length, measured and predicted", draw)]


def _controlled(data: dict) -> list:
    def draw(ax):
        a = [s["acceptance"] for s in data["sweep"]]
        ax.plot(a, [s["measured_speedup"] for s in data["sweep"]], marker="o", label=f"measured, g = {data['g']}")
        ax.plot(a, [s["predicted_speedup"] for s in data["sweep"]], ls="--", label="predicted E / (R + C)")
        ax.plot(a, [s["adaptive_speedup"] for s in data["sweep"]], marker="s", label="adaptive g")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xlabel("acceptance a (each guess right with probability a)")
        ax.set_ylabel("speed-up over MTP off")

    def draw_bars(ax):
        # Each bar's figure over what it needs (1 = just met), with the middle half of its
        # rounds as a whisker: how far this machine's noise reaches.
        bars = [b for b in data["bars"] if "middle_half" in b]
        y = range(len(bars))
        # Met, missed inside the machine's own noise (controlled_bars.noise), missed.
        colours = ["tab:green" if b["met"] else "tab:orange" if b.get("inside_noise") else "tab:red" for b in bars]
        ax.barh(y, [b["ratio"] / b["needed"] for b in bars], color=colours)
        low = [max(b["ratio"] - b["middle_half"][0], 0) / b["needed"] for b in bars]
        high = [max(b["middle_half"][1] - b["ratio"], 0) / b["needed"] for b in bars]
        ax.errorbar([b["ratio"] / b["needed"] for b in bars], y, xerr=[low, high], fmt="none", color="black", capsize=3)
        ax.axvline(1, color="grey", lw=0.8)
        ax.set_yticks(list(y), [textwrap.fill(b["bar"], 36) for b in bars], fontsize=6.5)
        ax.invert_yaxis()
        ax.set_xlabel("median of the rounds / needed (whiskers: their middle half)")

    figures = [("Controlled acceptance against its prediction", draw)]
    if any("middle_half" in b for b in data.get("bars", [])):  # JSON written before the whiskers had none
        figures.append(("The bars, and the spread of their rounds", draw_bars))
    return figures


def _overhead(data: dict) -> list:
    def draw(ax):
        build = {int(k): ms for k, ms in data["build_ms"].items()}  # JSON keys are strings
        g = sorted(build)
        ax.plot(g, [build[k] for k in g], marker="o", label="mlx-spec cycle build")
        ax.axhline(data["mlx_lm_build_ms"], color="grey", ls="--", label="mlx-lm, one token")
        ax.set_xlabel("draft length g")
        ax.set_ylabel("host ms to build the graph")

    return [("Host cost of building one cycle", draw)]


def _media(data: dict) -> list:
    runs = data.get("runs", [])
    if not runs:  # skipped: the model takes no image
        return []

    def draw(ax):
        labels = ["MTP off", "MTP g=6", "default"]
        width = 0.8 / len(runs)
        for i, run in enumerate(runs):
            rates = [run["mtp_off"]["tps"], run["mtp_on"]["tps"], run["default"]["tps"]]
            ax.bar([x + i * width for x in range(len(labels))], rates, width, label=run["sampling"])
        ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(labels))], labels)
        ax.set_ylabel("tok/s, an image in the prompt")

    return [(f"Decoding with a {runs[0]['image_tokens']}-token image in the prompt", draw)]


def _batch(data: dict) -> list:
    first = data["levels"][0].get("acceptance")  # (with --acceptance, the plots show the first one's)
    levels = [r for r in data["levels"] if r.get("acceptance") == first]
    at_once = [r["concurrency"] for r in levels]
    names = {"default": "mlx-spec default", "mtp_off": "mlx-spec MTP off", "mlx_lm": "mlx-lm BatchGenerator",
             "one_after_another": "mlx-spec, one after another"}

    def total(ax):
        for key, label in names.items():
            ax.plot(at_once, [r[key]["total_tps"] for r in levels], marker="o", label=label)
        ax.set_xlabel("requests at once")
        ax.set_ylabel("total tok/s")
        ax.set_xticks(at_once)

    def per_request(ax):
        for key in ("default", "mtp_off", "mlx_lm"):
            ax.plot(at_once, [r[key]["per_request_tps"] for r in levels], marker="o", label=names[key])
        ax.set_xlabel("requests at once")
        ax.set_ylabel("tok/s of each request (median)")
        ax.set_xticks(at_once)

    return [("Several requests at once: the whole batch", total), ("Several requests at once: each request", per_request)]


def _group(data: dict) -> list:
    rows = data["predicted_31b"]

    def predicted(ax):
        labels = [f"{r['ranks']} x {r['chip'].split(' (')[0]}" + (f", {r['latency_us']} us" if r["ranks"] > 1 else "")
                  for r in rows]
        at = range(len(rows))
        ax.bar([x - 0.2 for x in at], [r["mtp_off_tps"] for r in rows], width=0.4, label="MTP off")
        ax.bar([x + 0.2 for x in at], [r["mtp"][-1]["tps"] for r in rows], width=0.4,
               label=f"MTP, acceptance {rows[0]['mtp'][-1]['acceptance']}")
        ax.set_xticks(list(at))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("predicted tok/s")

    return [("Gemma 4 31B bf16 split over Macs on Thunderbolt 5 (predicted)", predicted)]


def _rollback(data: dict) -> list:
    def draw(ax):
        entries = data["by_rows_positions"]
        for rows in sorted({e["rows"] for e in entries}):
            mine = [e for e in entries if e["rows"] == rows]
            ax.plot([e["positions"] for e in mine], [e["per_position_ms"] / e["replay_ms"] for e in mine], marker="o",
                    label=f"{rows} rows")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xlabel("positions of a pass")
        ax.set_ylabel("per-position states / replay (time)")
        ax.legend()

    return [(f"Rolling back a Gated DeltaNet layer of {data['layer']}", draw)]


def _structured(data: dict) -> list:
    def draw(ax):
        cases = data["cases"]
        at = range(len(cases))
        for shift, key, label in ((-0.3, "off_tps", "MTP off"), (-0.1, "default_tps", "default"),
                                  (0.1, "free_tps", "default, no constraint"), (0.3, "mlx_lm_tps", "mlx-lm + llguidance")):
            ax.bar([x + shift for x in at], [c[key] for c in cases], width=0.2, label=label)
        ax.set_xticks(list(at))
        ax.set_xticklabels([c["case"] for c in cases], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("tok/s")
        ax.legend(fontsize=7)

    return [("Answers held to a schema or a regex", draw)]


FIGURES = {"positions": _positions, "acceptance": _acceptance, "draft_length": _draft_length,
           "controlled": _controlled, "overhead": _overhead, "media": _media, "batch": _batch, "group": _group,
           "rollback": _rollback, "structured": _structured}
