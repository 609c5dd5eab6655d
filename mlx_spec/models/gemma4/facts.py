"""Gemma 4's facts, in one place: attention types, which layers compute K/V, K/V heads per
type, the text config as mlx-lm reads it, and the K/V cache a context needs.

The loader, the memory check, the target and the size table all read them from here, so that a
new size or variant changes one module. (How far a sliding cache must trim is the loop's to say:
decoding/limits.py.)
"""

from typing import Any, Dict, List, Mapping, Optional

SLIDING = "sliding_attention"
FULL = "full_attention"

# The text models' types: the four first sizes' (`gemma4_text`) and the 12B's, whose text model is
# the same network without per-layer embeddings or experts (transformers' modular file says so).
TEXT_TYPES = ("gemma4_text", "gemma4_unified_text")
# The text type inside each multimodal wrapper, for a text_config that does not say.
TEXT_TYPE_OF = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text",
                "gemma4_assistant": "gemma4_text", "gemma4_unified_assistant": "gemma4_unified_text"}

# transformers' defaults for the keys where mlx-lm's ModelArgs defaults differ (mlx-lm assumes
# E2B): a config that leaves them out means what transformers makes of it. Per text type: the
# 12B's class has a longer window and context, and no per-layer embedding or expert keys at all
# (its configs never write them, and mlx-lm would otherwise build E2B's per-layer embeddings).
TRANSFORMERS_TEXT_DEFAULTS = {
    "gemma4_text": {
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "final_logit_softcapping": None,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
    },
}
TRANSFORMERS_TEXT_DEFAULTS["gemma4_unified_text"] = dict(
    TRANSFORMERS_TEXT_DEFAULTS["gemma4_text"], sliding_window=1024, max_position_embeddings=262144,
    use_bidirectional_attention="vision",
)
# What the 12B's text model never has, whatever its config says: transformers builds no
# per-layer embeddings and no experts for it.
UNIFIED_TEXT_FIXED = {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "enable_moe_block": False}


def as_mapping(config) -> Mapping[str, Any]:
    """A config as a mapping: a dict as it is, a dataclass (mlx-lm's ModelArgs) by its fields."""
    return config if isinstance(config, Mapping) else vars(config)


def layer_pattern(period: int, count: int) -> List[str]:
    """`period - 1` sliding layers then a full one, repeated to `count` layers."""
    one = [SLIDING] * (period - 1) + [FULL]
    return (one * (count // period + 1))[:count]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: the whole config for a text model, else its text_config
    (with the text type its wrapper implies when it does not name one)."""
    if config.get("model_type") in TEXT_TYPES:
        return config
    text = config.get("text_config", config)
    if isinstance(text, Mapping) and "model_type" not in text and config.get("model_type") in TEXT_TYPE_OF:
        text = dict(text, model_type=TEXT_TYPE_OF[config["model_type"]])
    return text


def normalize_text_config(text: Mapping[str, Any]) -> Dict[str, Any]:
    """The text config as mlx-lm reads it. Newer transformers write the full layers' head size
    and K/V head count to `per_layer_config` instead of `global_head_dim` and
    `num_global_key_value_heads`; fill those in from the full layers. Keys a config leaves out get
    transformers' defaults, not mlx-lm's."""
    text = dict(text)
    defaults = TRANSFORMERS_TEXT_DEFAULTS.get(text.get("model_type"), TRANSFORMERS_TEXT_DEFAULTS["gemma4_text"])
    for key, value in defaults.items():
        text.setdefault(key, value)
    if text.get("model_type") == "gemma4_unified_text":
        text.update(UNIFIED_TEXT_FIXED)
    text["layer_types"] = transformers_layer_types(text)
    per_layer = text.get("per_layer_config") or {}
    layer_types = text["layer_types"] or []
    renames = {"head_dim": "global_head_dim", "num_key_value_heads": "num_global_key_value_heads"}
    for index, overrides in per_layer.items():
        i = int(index)
        if i < len(layer_types) and layer_types[i] == FULL:
            for key, global_key in renames.items():
                if key in overrides and text.get(global_key) is None:
                    text[global_key] = overrides[key]
    if "per_layer_config" in text and text.get("global_head_dim") is None:
        # transformers leaves an override equal to the base out: the full layers' size is head_dim
        # (mlx-lm would take 512).
        text["global_head_dim"] = text.get("head_dim")
    return text


def transformers_layer_types(text: Mapping[str, Any]) -> Optional[List[str]]:
    """Each layer's attention type as transformers reads the config: five sliding layers to one
    full where it names none (mlx-lm's default is four to one), the last layer full always."""
    layer_types = text.get("layer_types")
    layers = text.get("num_hidden_layers")
    if not layer_types and isinstance(layers, int) and layers > 0:
        layer_types = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    if layer_types and layer_types[-1] != FULL:
        layer_types = [*layer_types[:-1], FULL]
    return list(layer_types) if layer_types else layer_types


def cached_layer_types(text: Mapping[str, Any]) -> List[str]:
    """The attention type of each layer that computes (and caches) its own K/V: the layers
    before the K/V-shared ones, which reuse the last of their type's."""
    layer_types = list(text.get("layer_types") or [])
    return layer_types[: len(layer_types) - (text.get("num_kv_shared_layers") or 0)]


def kv_source_layers(text) -> Dict[str, int]:
    """The last layer of each attention type that computes its own K/V (13 and 14 in E2B): the
    K/V-shared layers and the MTP drafter read these."""
    sources = {kind: i for i, kind in enumerate(cached_layer_types(as_mapping(text)))}
    missing = {SLIDING, FULL} - sources.keys()
    if missing:
        raise ValueError(f"no K/V-computing layer of type {sorted(missing)} in the target")
    return sources


def kv_heads(text) -> Dict[str, int]:
    """K/V heads per attention type. Full layers whose keys equal their values may have a count
    of their own (`num_global_key_value_heads`), as transformers and mlx-lm read the config.
    `text`: a text config, as a dict or as mlx-lm's ModelArgs."""
    text = as_mapping(text)
    sliding = text.get("num_key_value_heads") or 1
    full = sliding
    if text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
        full = text["num_global_key_value_heads"]
    return {SLIDING: sliding, FULL: full}


def head_dims(text) -> Dict[str, int]:
    """Head size per attention type (full layers may have a wider one: `global_head_dim`)."""
    text = as_mapping(text)
    return {SLIDING: text["head_dim"], FULL: text.get("global_head_dim") or text["head_dim"]}


def context_of(config: Mapping[str, Any]) -> Optional[int]:
    """The positions the target attends over at most (its text config's max_position_embeddings)."""
    text = text_config(config)
    if not isinstance(text, Mapping):
        return None
    return normalize_text_config(text).get("max_position_embeddings")


def kv_cache_bytes(config: Mapping[str, Any], context: int, sliding_slack: int) -> Optional[int]:
    """Bytes of a target's K/V cache at `context` tokens, from its config.json (or a published
    text config): the layers that compute K/V (K/V-shared layers hold none), a window and
    `sliding_slack` positions on sliding layers, the whole context on full ones, keys and values
    both (a keys-equal-values layer still caches its values apart: they are normalised
    differently). None where the config does not say enough."""
    text = text_config(config)
    if not isinstance(text, Mapping):
        return None
    text = normalize_text_config(text)  # per_layer_config's full-layer sizes, transformers' defaults
    if not all(k in text for k in ("num_hidden_layers", "head_dim", "sliding_window")):
        return None
    heads, dims = kv_heads(text), head_dims(text)
    per_position = {kind: heads[kind] * dims[kind] for kind in (SLIDING, FULL)}
    positions = {SLIDING: min(context, text["sliding_window"] + sliding_slack), FULL: context}
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    item = 4 if dtype == "float32" else 2  # bfloat16 unless the checkpoint says float32
    return sum(2 * per_position[kind] * positions[kind] * item for kind in cached_layer_types(text))
