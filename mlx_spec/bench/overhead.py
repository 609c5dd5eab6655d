"""What a cycle costs the host, measured without running the model: the time to build one cycle's
lazy graph for g = 0..8 and at g = 6 with the reports off, and the number of graph nodes
(primitives, each one a kernel launch) in a target pass, a draft step and sampling + acceptance +
reports, each both as a plain Python-built graph and compiled as the loop runs it; mlx-lm's
per-token figures beside them. The model has E2B's structure (35 layers, its K/V sharing and
layer types, 4-bit) at narrow widths with random weights: the host's work depends on the
structure, not on the widths, and nothing is downloaded.

With a positions table from a Mac (`--positions FILE`, or the same run's in `mlx-spec bench all`:
device times of a target pass and of the drafter), it also predicts tok/s with a serial build (build + device) and with a pipelined
one (max(build, device)), at acceptance 0 (g = 0) and 0.3 ... 1 (g = 6).

    mlx-spec bench overhead                 # seconds, anywhere
    mlx-spec bench overhead --positions mlx-spec-bench-<date>/positions.json
"""

import io
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma4_text
from mlx_lm.models.cache import make_prompt_cache

from ..decoding.reports import report_arrays
from ..decoding.sequence import SequenceState
from ..decoding.verify import Verifier
from ..drafting import DraftContext, MTPDrafter
from ..models.cache import trim_cache
from ..models.gemma4.assistant import Assistant, AssistantConfig
from ..models.gemma4.target import Target
from ..sampling.acceptance import accept_by_match
from ..sampling.distribution import distribution
from ..sampling.settings import SamplingSettings
from .one_row import as_row, one_row
from .checks import at_least, existing_file
from .common import arguments, header, machine, markdown, parse, write_json
from .models import E2B, E2B_ASSISTANT

# The E2B structure (35 layers, its sharing and layer types) at widths small enough to evaluate:
# the number of graph nodes depends on the structure, not on the widths.
NARROW = dict(E2B, hidden_size=128, intermediate_size=256, head_dim=64, global_head_dim=128, vocab_size=4096,
              vocab_size_per_layer_input=4096, hidden_size_per_layer_input=64)
NARROW_ASSISTANT = dict(E2B_ASSISTANT, hidden_size=128, intermediate_size=256, head_dim=64, global_head_dim=128,
                        vocab_size=4096)


def models(shape: dict, assistant_shape: dict, bits=4):
    """Target and drafter of these shapes with lazy random weights, quantized like the default
    model (the drafter stays bf16, as the default assistant)."""
    target = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(dict(shape, model_type="gemma4_text")))
    target.set_dtype(mx.bfloat16)
    nn.quantize(target, group_size=64, bits=bits,
                class_predicate=lambda p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % 64 == 0)
    config = {"text_config": dict(assistant_shape, model_type="gemma4_text"), "backbone_hidden_size": shape["hidden_size"],
              "use_ordered_embeddings": True, "num_centroids": assistant_shape["vocab_size"] // 128,
              "centroid_intermediate_top_k": 32}
    assistant = Assistant(AssistantConfig.from_dict(config))
    assistant.set_dtype(mx.bfloat16)
    assistant.masked_embedding.token_ordering = mx.random.permutation(assistant_shape["vocab_size"]).astype(mx.int32)
    return Target(target), assistant


def filled(target: Target, context: int, evaluate: bool) -> SequenceState:
    state = SequenceState(target)
    state.tokens = mx.random.randint(0, target.vocab_size, (context + 1,)).tolist()
    state.hidden = target.hidden(mx.array([state.tokens[:-1]]), state.cache)[:, -1:]
    if evaluate:
        mx.eval(state.hidden, [c.keys for c in state.cache], [c.values for c in state.cache])
    return state


def build_ms(target, settings, drafter, state, g, repeats, report=True) -> float:
    """Median host time to build a step of one row with g guesses, as a generation alone builds
    it, after one untimed build (which traces the compiled parts)."""
    times = []
    with one_row(target, state, settings, drafter, g, report) as build:
        for _ in range(repeats + 1):
            start = time.perf_counter()
            build()
            times.append(1000 * (time.perf_counter() - start))
            build.settled()
    return statistics.median(times[1:])


def mlx_lm_build_ms(target: Target, context: int, repeats: int) -> float:
    """mlx-lm's per-token graph: the model on one token, log-probs and the argmax."""
    cache = make_prompt_cache(target.model)
    target.model(mx.random.randint(0, target.vocab_size, (1, context)), cache=cache)
    y = mx.array([[1]])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        logits = target.model(y, cache=cache)[:, -1, :]
        y = mx.argmax(logits - mx.logsumexp(logits, keepdims=True), axis=-1)[None]
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def nodes(*arrays) -> int:
    """Primitives in the graph that computes `arrays` (evaluated arrays are leaves)."""
    out = io.StringIO()
    mx.export_to_dot(out, *arrays)
    return out.getvalue().count("shape=rectangle")


def node_counts(g: int) -> dict:
    """Nodes of each part of a cycle, the draft step and the verification tail both as plain
    Python-built graphs and as the loop builds them (compiled)."""
    target, assistant = models(NARROW, NARROW_ASSISTANT)
    mx.eval(target.model.parameters(), assistant.parameters())
    state = filled(target, 64, evaluate=True)
    caches = lambda: [a for c in state.cache for a in (c.keys, c.values)]  # noqa: E731
    last = mx.array([[1] * (g + 1)])
    logits, hidden = target(last, state.cache)
    counts = {"target pass, plain": nodes(logits, hidden, *caches())}
    mx.eval(logits, hidden, caches())
    trim_cache(state.cache, g + 1)
    with as_row(target, state) as row:
        for _ in range(2):  # the second call replays the trace the first one recorded
            logits, hidden = row.pass_(last)
            counts["target pass, compiled"] = nodes(logits, hidden, *row.caches.keys, *row.caches.values)
            mx.eval(logits, hidden, row.caches.keys, row.caches.values)
            row.cut(g + 1)
    logits, hidden = target(last, state.cache)
    mx.eval(logits, hidden, caches())
    settings = SamplingSettings.named("gemma")
    guesses, uniforms = mx.array([1] * g), mx.random.uniform(shape=(g + 1, 2))
    dist = distribution(logits[0], settings)
    kept, tokens = accept_by_match(dist, guesses, uniforms)
    plain_tail = nodes(kept, tokens, *report_arrays(logits[0], dist, tokens).values())
    kept, tokens, reports = Verifier(settings, True, target.traces).by_match(logits[0], guesses, uniforms)
    counts.update({"sampling + acceptance + reports, plain": plain_tail,
                   "sampling + acceptance + reports, compiled": nodes(kept, tokens, *reports.values())})
    trim_cache(state.cache, g + 1)
    kv = assistant.kv_inputs(target.drafter_buffers(state.cache))
    h, nxt = assistant.step(target.embed(mx.array([[1]])), state.hidden, kv, mx.array(64))
    drafter = MTPDrafter(assistant, target)
    context = DraftContext(state.tokens, mx.array([[1]]), state.hidden, target.drafter_buffers(state.cache),
                           settings, mx.zeros((1, 2)))
    counts.update({"draft step, plain": nodes(assistant.greedy_token(h), nxt),
                   "draft step, compiled": nodes(drafter.draft(context, 1).tokens)})
    with one_row(target, state, settings, drafter, g) as build:
        step = build()
        counts[f"whole cycle, g = {g}, as the loop builds it"] = nodes(*step.arrays())
    y = mx.array([[1]])
    lm_logits = target.model(y, cache=make_prompt_cache(target.model))[:, -1, :]
    counts["mlx-lm token"] = nodes(mx.argmax(lm_logits - mx.logsumexp(lm_logits, keepdims=True), axis=-1))
    return counts


def queued_share(ops: int = 3000) -> float:
    """The share of a long graph's time spent inside `mx.async_eval`, before it returns. MLX
    keeps about ten tasks in flight (a task: a Metal command buffer of up to 40-50 kernels or
    40-50 MB of inputs on a Mac, or ten CPU primitives) and queues the rest only as those
    finish, so the host is free only while the last ones run: near 1 for a graph of thousands
    of primitives. That is why the loop launches a cycle a draft step at a time and builds the
    next one in between (mlx_spec/decoding/launch.py)."""
    x = mx.ones((4, 4))
    mx.eval(x)
    for _ in range(ops):
        x = x * 1.0001 + 0.0001
    start = time.perf_counter()
    mx.async_eval(x)
    queued = time.perf_counter()
    mx.eval(x)
    return (queued - start) / (time.perf_counter() - start)


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench overhead")
    parser.add_argument("--context", type=at_least(1), default=256, help="positions in the caches [256]")
    parser.add_argument("--positions", type=existing_file, default=None, help="positions.py's JSON from a Mac, for predicted tok/s")
    args = parse(parser, argv, quick=dict())
    info = machine()
    # Evaluated weights: a compiled function treats them as constants (lazy ones it would recompute).
    target, assistant = models(NARROW, NARROW_ASSISTANT)
    mx.eval(target.model.parameters(), assistant.parameters())
    state = filled(target, args.context, evaluate=True)
    gemma = SamplingSettings.named("gemma")
    drafter = MTPDrafter(assistant, target)
    print(header("Host cost of a cycle (E2B structure at narrow widths, 4-bit, random weights)", info,
                 {"context": args.context, "repeats": args.repeats, "sampling": "gemma"}))
    build = {g: build_ms(target, gemma, drafter if g else None, state, g, args.repeats) for g in range(9)}
    reports_off = build_ms(target, gemma, drafter, state, 6, args.repeats, report=False)
    lm_ms = mlx_lm_build_ms(target, args.context, args.repeats)
    print(markdown(["g", "host build ms"], [[g, f"{ms:.2f}"] for g, ms in build.items()]
                   + [["6, reports off", f"{reports_off:.2f}"], ["mlx-lm token", f"{lm_ms:.2f}"]]))
    share = queued_share()
    print(f"\nShare of a 3,000-primitive graph's time spent before mx.async_eval returns: {100 * share:.0f}% "
          "(MLX keeps about ten tasks in flight: the host is free only while the last ones run)")
    counts = node_counts(6)
    print("\nGraph nodes (primitives, one kernel launch each), E2B structure. On a CPU, MLX's fused kernels")
    print(f"(RMS norm, RoPE, attention) appear as their fallbacks' many nodes; on Metal each is one. Here: {info['device']}\n")
    print(markdown(["graph", "nodes"], [[k, v] for k, v in counts.items()]))
    results = {"machine": info, "context": args.context, "build_ms": build, "build_ms_reports_off": reports_off,
               "queued_share": share,
               "mlx_lm_build_ms": lm_ms, "nodes": counts}
    # The positions table of the same run (`mlx-spec bench all`) when no other is given.
    positions = args.positions or (Path(args.out) / "positions.json")
    if Path(positions).is_file():
        results["predicted"] = predict(json.loads(Path(positions).read_text()), build, lm_ms)
    print(f"\nJSON: {write_json('overhead', args, results)}")


def predict(positions: dict, build: dict, lm_ms: float) -> list:
    """tok/s at acceptance 0 (g = 0) and 1 (g = 6) from device times and this host's build times."""
    context = min(r["context"] for r in positions["target"])
    device = {r["positions"]: r["ms"] for r in positions["target"] if r["context"] == context}
    draft = {r["steps"]: r["ms"] for r in positions["drafter"]}
    rows = []
    # Acceptance a keeps 1 + a + ... + a^g tokens a cycle. Before every cycle was built ahead
    # (issue 24), cycles at middle acceptances were built after the sync: serial. Now all are
    # pipelined, and the gain there is serial / pipelined.
    cases = [("acceptance 0, g = 0", 0, 1.0)] + [(f"acceptance {a:g}, g = 6", 6, sum(a**i for i in range(7)))
                                                  for a in (0.3, 0.5, 0.7, 1.0)]
    for name, g, tokens in cases:
        dev = device[g + 1] + draft.get(g, 0.0)
        serial, piped = build[g] + dev, max(build[g], dev)
        rows.append({"case": name, "device_ms": dev, "serial_tps": 1000 * tokens / serial, "pipelined_tps": 1000 * tokens / piped,
                     "gain": serial / piped})
    rows.append({"case": "mlx-lm (pipelined)", "device_ms": device[1], "pipelined_tps": 1000 / max(lm_ms, device[1])})
    print(f"\nPredicted with the device times of {positions['machine']['chip']} at context {context}:\n")
    print(markdown(["case", "device ms", "serial tok/s", "pipelined tok/s", "pipelined / serial"],
                   [[r["case"], f"{r['device_ms']:.2f}", f"{r.get('serial_tps', 0):.1f}", f"{r['pipelined_tps']:.1f}",
                     f"{r['gain']:.2f}x" if "gain" in r else ""] for r in rows]))
    return rows


if __name__ == "__main__":
    main()
