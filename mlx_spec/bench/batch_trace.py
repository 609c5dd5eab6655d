"""`bench batch --trace`: where the default's decoding time goes in a batch, step by step.

The engine's cost model records each settled step while the default runs (step_clock.py): its
rows and positions, each stepping row's g, the time since the sync before and what the model
expected of a step of that shape and of a plain one. This sums them per batch size: how many
steps carried guesses (probes among them), the time they took, and what they cost over the plain
steps the model expected in their place, the share of the steps' time that drafting cost where
nothing it guessed was kept."""

import statistics
from typing import Dict, List

from .common import markdown


def summary(steps: List[dict]) -> dict:
    """The figures of one level's recorded steps (every round's default runs)."""
    timed = [s for s in steps if s["seconds"] is not None]
    plain = [s for s in timed if s["positions"] == 1]
    guessing = [s for s in timed if s["positions"] > 1]
    total = sum(s["seconds"] for s in timed)
    # What a step with guesses cost over the plain step the model expected of its rows.
    extra = sum(s["seconds"] - s["plain_expected"] for s in guessing if s["plain_expected"] is not None)
    shapes: Dict[str, List[dict]] = {}
    for s in timed:
        shapes.setdefault(f"{s['rows']}x{s['positions']}", []).append(s)
    return {
        "steps": len(steps), "with_guesses": sum(s["positions"] > 1 for s in steps),
        "rows_drafting_per_guess_step": statistics.mean([sum(g > 0 for g in s["asked"]) for s in guessing]) if guessing else 0.0,
        "seconds": total, "plain_seconds": sum(s["seconds"] for s in plain),
        "guess_seconds": sum(s["seconds"] for s in guessing), "guess_extra_seconds": extra,
        "guess_extra_share": extra / total if total else 0.0,
        "shapes": {shape: {"steps": len(group), "median_ms": 1000 * statistics.median(s["seconds"] for s in group),
                           "expected_ms": 1000 * statistics.median(s["expected"] for s in group) if all(
                               s["expected"] is not None for s in group) else None}
                   for shape, group in sorted(shapes.items())},
    }


def print_summary(levels: List[dict]) -> None:
    """Where the default's step time went at each batch size (each level's `label` names it)."""
    print("\nThe trace (--trace): the default's steps at each batch size, every round; a step with guesses "
          "charged its time over the plain step the cost model expected of its rows:\n")
    rows = []
    for level in levels:
        t = level["trace"]
        rows.append([level["label"], t["steps"], t["with_guesses"], f"{t['rows_drafting_per_guess_step']:.1f}",
                     f"{t['seconds']:.2f}", f"{t['guess_seconds']:.3f}", f"{t['guess_extra_seconds']:.3f}",
                     f"{100 * t['guess_extra_share']:.1f}%"])
    print(markdown(["at once", "steps", "with guesses", "rows drafting in one", "steps' time (s)", "in steps with guesses (s)",
                    "their extra over plain (s)", "extra / steps' time"], rows))
    shapes = [[level["label"], shape, f["steps"], f"{f['median_ms']:.2f}",
               "-" if f["expected_ms"] is None else f"{f['expected_ms']:.2f}"]
              for level in levels for shape, f in level["trace"]["shapes"].items()]
    print("\n" + markdown(["at once", "rows x positions", "steps timed", "median ms", "cost model expected ms"], shapes))
