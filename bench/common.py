"""Shared pieces of the benchmarks: the machine, the models, timing, and the output.

Models come from real checkpoints (`--model`, `--drafter`), or are built with random weights:
`--random-weights` gives the real E2B target and drafter shapes (`--shape e4b|26b-a4b|31b|12b`: those
sizes' shapes from their published configs), quantized like the 4-bit conversions, built layer by
layer so memory stays near the final size; `--shape small` gives a scaled-down Gemma 4 of the
same structure for machines where MLX runs on the CPU.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_lm.models import gemma4_text  # noqa: E402

from mlx_spec.assistant import Assistant, AssistantConfig  # noqa: E402
from mlx_spec.engine import Engine, load  # noqa: E402
from mlx_spec.family import FAMILY  # noqa: E402
from mlx_spec.loading import AUTO  # noqa: E402
from mlx_spec.target import Target  # noqa: E402

ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
    "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1e4, "rope_type": "default"},
}
# Gemma 4 E2B and its assistant (docs/design.md, sections 1 and 2).
E2B = dict(
    hidden_size=1536, num_hidden_layers=35, intermediate_size=6144, num_attention_heads=8, head_dim=256,
    global_head_dim=512, num_key_value_heads=1, num_kv_shared_layers=20, vocab_size=262144,
    vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256, sliding_window=512,
    final_logit_softcapping=30.0, use_double_wide_mlp=True, rope_parameters=ROPE,
)
E2B_ASSISTANT = dict(
    hidden_size=256, num_hidden_layers=4, intermediate_size=2048, num_attention_heads=4, head_dim=256,
    global_head_dim=512, num_key_value_heads=1, vocab_size=262144, sliding_window=512,
    layer_types=["sliding_attention"] * 3 + ["full_attention"], rope_parameters=ROPE,
)
# The same structure at widths MLX's CPU backend handles in tens of milliseconds.
SMALL = dict(
    E2B, hidden_size=512, num_hidden_layers=10, intermediate_size=2048, num_attention_heads=4, head_dim=128,
    global_head_dim=256, num_kv_shared_layers=4, vocab_size=32768, vocab_size_per_layer_input=32768,
    hidden_size_per_layer_input=64, sliding_window=128,
)
SMALL_ASSISTANT = dict(
    E2B_ASSISTANT, hidden_size=128, intermediate_size=512, head_dim=128, global_head_dim=256,
    vocab_size=32768, sliding_window=128,
)


def family_shape(name: str):
    """(target shape, drafter shape, centroid head?) of a Gemma 4 size from its published configs
    (mlx_spec/family.py)."""
    size = FAMILY[name]
    drafter = dict(size.assistant)
    ordered = drafter.pop("use_ordered_embeddings")
    drafter.pop("backbone_hidden_size")
    return dict(size.text, rope_parameters=ROPE), dict(E2B_ASSISTANT, **drafter), ordered


SHAPES = ["e2b", "e4b", "26b-a4b", "31b", "12b", "small"]
# Memory bandwidth of Apple chips in GB/s (docs/design.md, section 5).
APPLE_BANDWIDTH = {"M1": 68, "M2": 100, "M3": 100, "M4": 120, "M5": 153, "M5 Pro": 307, "M5 Max": 614}


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", help="target: e2b|e4b|26b-a4b|31b|12b (4-bit MLX), hub id or folder")
    parser.add_argument("--drafter", default=AUTO, help="drafter: auto (the target's assistant), size name, hub id or folder")
    parser.add_argument("--random-weights", action="store_true", help="a real shape, random weights, 4-bit")
    parser.add_argument("--shape", choices=SHAPES, default="e2b", help="shape for --random-weights")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (the median is reported)")
    parser.add_argument("--out", default=None, help="JSON output file [bench/results/<script>.json]")
    return parser


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

    return {
        "chip": chip,
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
        "os": platform.platform(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "metal": bool(mx.metal.is_available()),
    }


def _run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def chip_bandwidth(chip: str):
    """The chip's memory bandwidth in GB/s if it is a known Apple chip, else None."""
    name = chip.replace("Apple ", "")
    return APPLE_BANDWIDTH.get(name)


# -- models ------------------------------------------------------------------------------------


def build_engine(args) -> Engine:
    if args.model:
        return load(args.model, args.drafter)
    if not args.random_weights:
        raise SystemExit("give --model (and --drafter), or --random-weights [--shape small]")
    ordered = True
    if args.shape == "e2b":
        target_shape, drafter_shape = E2B, E2B_ASSISTANT
    elif args.shape == "small":
        target_shape, drafter_shape = SMALL, SMALL_ASSISTANT
    else:
        target_shape, drafter_shape, ordered = family_shape(args.shape)
    bits = None if args.shape == "small" else 4  # MLX's CPU matmul is fastest unquantized
    target = random_target(target_shape, bits)
    drafter = random_drafter(drafter_shape, target_shape["hidden_size"], ordered=ordered)
    return Engine(target, drafter, tokenizer=None, stop_tokens=[])


def random_target(shape: dict, bits=None, group_size: int = 64) -> Target:
    """A Gemma 4 target with random weights, built one piece at a time (quantized as it goes)
    so that no full-precision copy of the whole model ever exists."""
    args = gemma4_text.ModelArgs.from_dict(dict(shape, model_type="gemma4_text"))
    model = gemma4_text.Model(args)  # lazy: nothing is allocated yet
    text = model.model
    text.embed_tokens = random_embedding(args.vocab_size, args.hidden_size, bits, group_size)
    pieces = ["norm"]
    if args.hidden_size_per_layer_input:  # per-layer embeddings (E2B, E4B)
        text.embed_tokens_per_layer = random_embedding(
            args.vocab_size_per_layer_input, args.num_hidden_layers * args.hidden_size_per_layer_input, bits, group_size
        )
        pieces += ["per_layer_model_projection", "per_layer_projection_norm"]
    for layer in text.layers:
        settle(layer, bits, group_size)
    for name in pieces:
        settle(getattr(text, name), bits, group_size)
    model.eval()
    return Target(model)


def random_drafter(shape: dict, backbone: int, bits=None, ordered: bool = True) -> Assistant:
    config = {
        "text_config": dict(shape, model_type="gemma4_text"), "backbone_hidden_size": backbone,
        "use_ordered_embeddings": ordered, "num_centroids": shape["vocab_size"] // 128,
        "centroid_intermediate_top_k": 32,
    }
    assistant = Assistant(AssistantConfig.from_dict(config))
    vocab = shape["vocab_size"]
    if ordered:
        assistant.masked_embedding.token_ordering = mx.random.permutation(vocab).astype(mx.int32)
    assistant.model.embed_tokens = random_embedding(vocab, shape["hidden_size"], bits, 64)
    settle(assistant, bits, 64)
    assistant.eval()
    return assistant


def settle(module: nn.Module, bits, group_size: int) -> None:
    """Cast to bfloat16, quantize if asked, and materialise this piece now."""
    module.set_dtype(mx.bfloat16)
    if bits:
        # Linear layers and the experts' stacked ones (SwitchLinear), as mlx-lm's conversions do.
        nn.quantize(module, group_size=group_size, bits=bits,
                    class_predicate=lambda p, m: hasattr(m, "to_quantized") and not isinstance(m, nn.Embedding)
                    and m.weight.shape[-1] % group_size == 0)
    mx.eval(module.parameters())


def random_embedding(rows: int, dims: int, bits, group_size: int, chunk: int = 8192) -> nn.Module:
    """A random (quantized) embedding table made in row chunks."""
    if not bits:
        embedding = nn.Embedding(rows, dims)
        embedding.weight = (mx.random.normal((rows, dims)) * 0.02).astype(mx.bfloat16)
        mx.eval(embedding.weight)
        return embedding
    parts = []
    for start in range(0, rows, chunk):
        w = (mx.random.normal((min(chunk, rows - start), dims)) * 0.02).astype(mx.bfloat16)
        parts.append(mx.quantize(w, group_size=group_size, bits=bits))
        mx.eval(parts[-1])
    embedding = nn.QuantizedEmbedding(rows, dims, group_size=group_size, bits=bits)
    embedding.weight, embedding.scales, embedding.biases = (mx.concatenate([p[i] for p in parts]) for i in range(3))
    mx.eval(embedding.parameters())
    return embedding


def describe_models(args) -> dict:
    if args.model:
        if args.drafter == AUTO:
            return {"target": args.model, "drafter": "auto (the target's assistant)"}
        return {"target": args.model, "drafter": args.drafter}
    return {"target": f"random weights, {args.shape} shape", "drafter": f"random weights, {args.shape} shape"}


def weight_bytes_per_pass(target: Target) -> int:
    """Bytes of weights one target pass reads: every parameter except the embedding tables,
    which are looked up rather than read whole; the tied LM head reads the embedding once."""
    from mlx.utils import tree_flatten

    total = 0
    for name, value in tree_flatten(target.model.parameters()):
        if "embed_tokens_per_layer" in name:
            continue
        total += value.nbytes
    return total


# -- timing and output -------------------------------------------------------------------------


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
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"{script}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    return out


def header(title: str, machine_info: dict, settings: dict) -> str:
    m = machine_info
    lines = [f"## {title}", "", f"Machine: {m['chip']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}",
             f"mlx {m['mlx']} ({m['device']}), mlx-lm {m['mlx_lm']}", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    return "\n".join(lines)
