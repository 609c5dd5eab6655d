"""Prompt lookup's host cost: indexing a long prompt from scratch, and a decoding cycle's lookup
at a long context (the index follows its sequence: O(new tokens) per cycle). No model is needed.

    python bench/lookup.py            # bars: a cycle at 100k tokens < 0.05 ms; a 32k prompt < 50 ms
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_spec.bench.common import header, machine, markdown  # noqa: E402
from mlx_spec.drafting.ngrams import NgramIndex  # noqa: E402

CYCLE_BAR_MS, INDEX_BAR_MS = 0.05, 50.0


def text(length: int, seed: int) -> list:
    """Token ids with the repetition of real text: a 4,000-token vocabulary, Zipf-distributed
    (a few common tokens, a long tail), so that short n-grams recur and lookups find matches."""
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.3, size=length) % 4000).tolist()


def index_ms(tokens: list, repeats: int) -> float:
    """Median time to index `tokens` from scratch (what a new conversation's prompt costs)."""
    times = []
    for _ in range(repeats):
        index = NgramIndex()
        start = time.perf_counter()
        index.continuation(tokens, 6)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def cycle_ms(context: int, cycles: int, g: int, seed: int) -> dict:
    """A decoding cycle's lookup at `context` tokens: the tokens a cycle settled (1 to g + 1,
    some cycles taking back a queued one's) are added, then the next guesses are looked up."""
    tokens = text(context + cycles * (g + 1), seed)
    held, index = tokens[:context], NgramIndex()
    index.continuation(held, g)  # the prompt, indexed once
    rng = np.random.default_rng(seed + 1)
    times, found, at = [], 0, context
    for _ in range(cycles):
        settled = int(rng.integers(1, g + 2))
        held.extend(tokens[at : at + settled])
        at += settled
        start = time.perf_counter()
        if rng.random() < 0.1:  # a stop inside a queued cycle: the sequence takes a token back
            index.cut(held, len(held) - 1)
            del held[-1]
        guesses = index.continuation(held, g)
        times.append(1000 * (time.perf_counter() - start))
        found += bool(guesses)
    return {"median_ms": statistics.median(times), "p99_ms": float(np.percentile(times, 99)), "hit_share": found / cycles}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(header("Prompt lookup: host time", machine(), {"cycles": args.cycles, "g": 6, "repeats": args.repeats}))
    rows = []
    for length in (32_768, 100_000):
        ms = index_ms(text(length, 0), args.repeats)
        bar = f"< {INDEX_BAR_MS:.0f} ms: {'met' if ms < INDEX_BAR_MS else 'NOT met'}" if length == 32_768 else ""
        rows.append([f"index a {length:,}-token prompt from scratch", f"{ms:.1f} ms", bar])
    for context in (32_768, 100_000):
        c = cycle_ms(context, args.cycles, 6, 1)
        bar = f"< {CYCLE_BAR_MS} ms: {'met' if c['median_ms'] < CYCLE_BAR_MS else 'NOT met'}" if context == 100_000 else ""
        rows.append([f"one cycle's lookup at {context:,} tokens (median; p99 {c['p99_ms']:.3f} ms; "
                     f"{100 * c['hit_share']:.0f}% found guesses)", f"{c['median_ms']:.4f} ms", bar])
    print(markdown(["what", "time", "bar"], rows))


if __name__ == "__main__":
    main()
