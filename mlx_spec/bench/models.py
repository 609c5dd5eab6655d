"""The models a benchmark measures: a real pair by name (E2B by default, downloaded as `chat`
does), or random weights in a real size's shapes (`--random-weights --shape ...`), quantized like
the 4-bit conversions and built layer by layer so memory stays near the final size; `small` is
a scaled-down Gemma 4 of the same structure for machines where MLX runs on the CPU."""

from pathlib import Path

import mlx.core as mx
from mlx_lm.models import gemma4_text

from ..decoding.lockstep import Lockstep
from ..engine import Engine
from ..models import FAMILIES
from ..loading import load
from ..models.gemma4.assistant import Assistant, AssistantConfig
from ..models.gemma4.sizes import SIZES
from ..models.gemma4.target import Target
from .random_tables import random_embedding, settle

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
    (models/gemma4/sizes.py)."""
    size = SIZES[name]
    drafter = dict(size.assistant)
    ordered = drafter.pop("use_ordered_embeddings")
    drafter.pop("backbone_hidden_size")
    return dict(size.text, rope_parameters=ROPE), dict(E2B_ASSISTANT, **drafter), ordered




def build_engine(args, group=None) -> Engine:
    """The pair to measure: --random-weights of a shape, else --model (E2B by default, downloaded
    as `mlx-spec chat` does) with its drafter. `group`: split over it (bench/group.py). Random
    weights are drawn from a fixed seed: the same on every rank of a group, and alone."""
    if not args.random_weights:
        return load(args.model or "e2b", args.drafter, group=group)
    mx.random.seed(0)
    if args.shape.startswith("qwen"):
        from .random_qwen import random_qwen

        return random_qwen(args.shape, group=group)
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
    if group is None:
        return Engine.of(target, drafter)
    FAMILIES.default.split(target, drafter, group)
    return Engine.of(target, drafter, lockstep=Lockstep(group))


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


def describe_models(args) -> dict:
    """The pair by name, and each model's files with their sha256 (see `files.fingerprint`)."""
    if args.random_weights:
        return {"target": f"random weights, {args.shape} shape", "drafter": f"random weights, {args.shape} shape"}
    from ..loading import resolve_names
    from ..memory import AUTO, auto_drafter, read_config
    from .files import fingerprint

    target, drafter = resolve_names(args.model or "e2b", args.drafter)
    if drafter == AUTO:  # a folder or hub id not known by name: the drafter its family names for it
        config = read_config(Path(target).expanduser() / "config.json")
        drafter = auto_drafter(target, config, FAMILIES) if config is not None else None
    return {"target": target, "drafter": drafter or "none", "files": fingerprint(target, drafter)}


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


