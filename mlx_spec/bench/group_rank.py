"""One rank of `mlx-spec bench group` (or the process alone): run by bench/group.py as

    python -m mlx_spec.bench.group_rank SETTINGS_JSON             # alone
    mlx.launch --backend ring -n 2 python -m mlx_spec.bench.group_rank SETTINGS_JSON

It loads the pair (split over the group where there is one), times each setting's answer to
the same prompt, counts the collectives the loop runs per cycle and the bytes they carry (with
compilation off, so that every all-reduce is a Python call: each is counted where it runs),
and rank 0 prints one JSON line.
"""

import json
import sys
from dataclasses import replace
import time
from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from ..decoding.lockstep import launched_group
from ..options import Options
from .models import build_engine


class CountedCollectives:
    """mx.distributed.all_sum counted while it is in place: calls and bytes summed."""

    def __init__(self):
        self.calls, self.bytes, self._original = 0, 0, None

    def __enter__(self):
        self._original = mx.distributed.all_sum

        def counted(x, *args, **kwargs):
            self.calls += 1
            self.bytes += x.nbytes
            return self._original(x, *args, **kwargs)

        mx.distributed.all_sum = counted
        return self

    def __exit__(self, *exc):
        mx.distributed.all_sum = self._original


def collectives(engine, prompt, options: Options) -> dict:
    """All-reduces per cycle and the bytes each rank adds to them per settled token, in a short
    answer with compilation off (the compiled loop runs the same collectives, recorded once)."""
    mx.disable_compile()
    try:
        with CountedCollectives() as counted:
            result = engine.generate(prompt, options)
    finally:
        mx.enable_compile()
    stats = result.stats
    return {"per_cycle": counted.calls / max(stats.cycles, 1), "payload_bytes_per_token": counted.bytes / max(len(result.tokens), 1)}


def timed(engine, prompt, options: Options) -> dict:
    engine.generate(prompt, replace(options, max_tokens=8))  # warm: traces
    began = time.perf_counter()
    result = engine.generate(prompt, options)
    seconds = time.perf_counter() - began
    return {"tokens": result.tokens, "tps": len(result.tokens) / seconds, "cycles": result.stats.cycles,
            "kept": result.stats.kept, "drafted": result.stats.drafted}


def first_logits(engine, prompt) -> list:
    """The target's logits after the prompt (float32): split, the order of a sum changes, and
    in bf16 its rounding with it (group.py reports how far they move)."""
    target = engine.target
    hidden = target.prefill(mx.array([prompt]), target.make_cache(8), 512)
    return target.logits(hidden)[0, -1].astype(mx.float32).tolist()


def main(settings: dict) -> None:
    group = launched_group()  # mlx.launch's group (joined as the commands join it)
    args = SimpleNamespace(random_weights=settings["random_weights"], shape=settings["shape"],
                           model=settings["model"], drafter=settings["drafter"])
    engine = build_engine(args, group=group).with_stop_tokens([])
    prompt = np.random.default_rng(0).integers(5, engine.target.vocab_size, settings["prompt_tokens"]).tolist()
    out = {"size": group.size() if group else 1, "runs": {}, "first_logits": first_logits(engine, prompt)}
    for name, options in settings["runs"].items():
        options = Options(max_tokens=settings["max_tokens"], **options)
        out["runs"][name] = {**timed(engine, prompt, options),
                             **collectives(engine, prompt, replace(options, max_tokens=min(24, settings["max_tokens"])))}
    if group is None or group.rank() == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
