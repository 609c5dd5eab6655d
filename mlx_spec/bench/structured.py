"""Answers held to a JSON schema or a regex: what drafting gains under a constraint, and what the
constraint costs (its masks, the host sync before a constrained pass, the pipelining it gives up).

For each case, in interleaved rounds, greedy: MTP off under the constraint, the default (drafting
on) under it, the default without it, and mlx-lm's own decoding under the same llguidance mask
(a logits processor, as mlx-lm's users constrain it). Every constrained run must give the same
tokens. The bar: the default under a constraint at least MTP off under it.

    mlx-spec bench structured                        # E2B (downloaded as chat does)
    mlx-spec bench structured --model FOLDER         # any checkpoint with a tokenizer

Random weights have no tokenizer, so no grammar can be read against their vocabulary: the table
is skipped for them by name.
"""

import statistics
import time

import mlx.core as mx

from ..options import Options
from ..sampling.masks import restricted
from .common import TableSkipped, arguments, header, machine, markdown, parse, write_json
from .checks import at_least
from .models import build_engine, describe_models
from .prefills import Prefills, prompt_sequence
from .runs import rate

RECORD = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}, "active": {"type": "boolean"},
                         "role": {"enum": ["admin", "editor", "viewer"]}},
          "required": ["name", "age", "city", "active", "role"]}
TOOL_ARGUMENTS = {"type": "object", "additionalProperties": False,
                  "properties": {"command": {"type": "string", "maxLength": 60},
                                 "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600},
                                 "working_directory": {"type": "string", "maxLength": 40}},
                  "required": ["command", "timeout_seconds", "working_directory"]}
MIN_TIMED = 8  # tokens an answer needs for its rate to be shown
CASES = [  # (name, the user's message, the constraint)
    ("record", "Invent a user of a web application, as JSON.", {"json_schema": RECORD}),
    ("tool arguments", "List the files in /tmp, as the arguments of a shell tool, in JSON.", {"json_schema": TOOL_ARGUMENTS}),
    ("any JSON object", "Describe Taipei in a JSON object.", {"json_schema": True}),
    ("date (regex)", "When did the first Moon landing happen? Answer as YYYY-MM-DD.", {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}),
]


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench structured")
    parser.add_argument("--max-tokens", type=at_least(8), default=160, help="tokens per answer at most [160]")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds [3]")
    args = parse(parser, argv, quick=dict(max_tokens=64, rounds=1))
    if args.random_weights:
        raise TableSkipped("structured: random weights have no tokenizer to read a grammar against; give --model")
    engine = build_engine(args)
    if engine.tokenizer is None:
        raise TableSkipped(f"structured: {args.model} has no tokenizer to read a grammar against")
    info, models = machine(), describe_models(args)
    print(header("Structured output", info, {"max tokens": args.max_tokens, "rounds": args.rounds, "greedy": "yes",
                                             "chat template": "thinking off", **models}))
    prefills = Prefills(engine)
    entries = [measure(engine, prefills, name, message, constraint, args) for name, message, constraint in CASES]
    print(markdown(["case", "tokens", "MTP off", "default", "default, no constraint", "mlx-lm + llguidance",
                    "default / off", "default / mlx-lm", "forced guesses kept / tokens", "ms per cycle (off / default)",
                    "mask ms per token", "MTP kept (constrained / free)", "same tokens"], [row(e) for e in entries]))
    print("\ntok/s: decode speed after the first cycle (the prompt left out), the median of the rounds; each ratio "
          "the median of the rounds' ratios. Forced guesses: the tokens a grammar forces (keys, quotes, braces), "
          "drafted whenever it has some. Mask ms: the host's time building the masks, per token. MTP kept: the "
          "assistant's guesses kept over those drafted, with the constraint and without ('-': it drafted none). "
          "Every constrained run greedy; 'same tokens': MTP off, the default and mlx-lm under the same mask gave "
          "the same answer.\n")
    timed = [e for e in entries if e["tokens"] >= MIN_TIMED]
    short = [e["case"] for e in entries if e["tokens"] < MIN_TIMED]
    if short:
        print(f"Too short to time (under {MIN_TIMED} tokens: a rate over a cycle or two says nothing): {', '.join(short)}")
    bar = [e["case"] for e in timed if e["default_over_off"] < 1]
    print(f"Bar (default >= MTP off under each constraint): {'met' if not bar else 'NOT met: ' + ', '.join(bar)}")
    results = {"machine": info, "models": models, "max_tokens": args.max_tokens, "rounds": args.rounds, "cases": entries}
    print(f"JSON: {write_json('structured', args, results)}")


def measure(engine, prefills, name: str, message: str, constraint: dict, args) -> dict:
    prompt = engine.encode([{"role": "user", "content": message}], thinking=False)
    settings = dict(max_tokens=args.max_tokens, **constraint)
    runs = {"off": [], "default": [], "free": [], "mlx_lm": []}
    for _ in range(args.rounds + 1):  # the first round warms up (compiled graphs, the grammar's tokenizer)
        for kind, options in (("off", Options(mtp=False, **settings)), ("default", Options(**settings)),
                              ("free", Options(max_tokens=args.max_tokens))):
            runs[kind].append(run_ours(engine, prefills, prompt, options))
        runs["mlx_lm"].append(run_mlx_lm_constrained(engine, prompt, constraint, args.max_tokens))
    runs = {k: v[1:] for k, v in runs.items()}
    tps = {k: statistics.median(r["tps"] for r in v) for k, v in runs.items()}
    default = runs["default"][0]
    return {"case": name, "constraint": constraint, "tokens": len(default["tokens"]), **{f"{k}_tps": v for k, v in tps.items()},
            "default_over_off": _ratio(runs["default"], runs["off"]), "default_over_mlx_lm": _ratio(runs["default"], runs["mlx_lm"]),
            "forced_kept": default["forced_kept"], "ms_per_cycle_off": runs["off"][0]["ms_per_cycle"],
            "ms_per_cycle_default": default["ms_per_cycle"], "mask_ms_per_token": default["mask_ms_per_token"],
            "mtp_constrained": _acceptance(runs["default"]), "mtp_free": _acceptance(runs["free"]),
            "same_tokens": all(r["tokens"] == default["tokens"] for k in ("off", "default", "mlx_lm") for r in runs[k])}


def _acceptance(runs) -> float:
    """The assistant's guesses kept over those drafted, over the rounds (None: it drafted none)."""
    kept, drafted = (sum(r["mtp"][i] for r in runs) for i in (0, 1))
    return kept / drafted if drafted else None


def _ratio(ours, theirs) -> float:
    return statistics.median(a["tps"] / b["tps"] for a, b in zip(ours, theirs) if b["tps"])


def row(e: dict) -> list:
    def shown(key, digits=1):
        return f"{e[key]:.{digits}f}" if e["tokens"] >= MIN_TIMED else "-"

    return [e["case"], e["tokens"], shown("off_tps"), shown("default_tps"), f"{e['free_tps']:.1f}", shown("mlx_lm_tps"),
            shown("default_over_off", 2), shown("default_over_mlx_lm", 2), f"{e['forced_kept']} / {e['tokens']}",
            f"{e['ms_per_cycle_off']:.1f} / {e['ms_per_cycle_default']:.1f}", f"{e['mask_ms_per_token']:.3f}",
            f"{_share(e['mtp_constrained'])} / {_share(e['mtp_free'])}", "yes" if e["same_tokens"] else "NO"]


def _share(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_ours(engine, prefills, prompt, options: Options) -> dict:
    decoder = engine.decoder(options)
    tokens, times, cycles = [], [], []
    with prompt_sequence(engine, decoder, prompt, (), prefills) as state:
        for report in decoder.generate(state, options.max_tokens):
            tokens.append(report.token)
            times.append(time.perf_counter())
            cycles.append(report.cycle)
    s = decoder.stats
    return {"tokens": tokens, "tps": rate(times, cycles), "forced_kept": s.kept_by_source.get("grammar", 0),
            "ms_per_cycle": 1000 * s.generation_seconds / max(s.cycles, 1),
            "mtp": (s.kept_by_source.get("mtp", 0), s.drafted_by_source.get("mtp", 0)),
            "mask_ms_per_token": 1000 * s.mask_seconds / max(len(tokens), 1)}


def run_mlx_lm_constrained(engine, prompt, constraint: dict, max_tokens: int) -> dict:
    """mlx-lm's stream_generate with a logits processor that applies llguidance's mask, as a user
    of mlx-lm constrains it (its sampler greedy)."""
    from mlx_lm.generate import stream_generate

    matcher = engine.grammars.matcher(Options(**constraint).constraint)
    tokens, times = [], []
    for response in stream_generate(engine.target.model, engine.tokenizer, prompt, max_tokens=max_tokens,
                                    logits_processors=[_processor(matcher, len(prompt))]):
        tokens.append(response.token)
        times.append(time.perf_counter())
        if response.token in engine.stop_tokens:
            break
    return {"tokens": tokens, "tps": rate(times)}


def _processor(matcher, prompt_length: int):
    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens.size - prompt_length
        if generated > len(matcher.settled):
            matcher.advance(tokens[prompt_length + len(matcher.settled):].tolist())
        return restricted(logits, mx.array(matcher.masks([])[0]))

    return process
