"""Tiny random Gemma 4 checkpoints, built and saved with transformers (the reference).

They keep the real structure (sliding + full layers, K/V sharing, per-layer embeddings,
double-wide MLPs on shared layers, softcap, proportional RoPE, the assistant's centroid head)
at toy widths, with a sliding window of 12 so tests cross it, and every parameter randomised
(norm scales and layer scalars too) so that a wrong formula cannot hide behind a weight of one.
The tokenizer is a real BPE trained locally with `tokenizers`, with Gemma 4's special tokens at
their real ids and Google's own chat template.
"""

import json
from pathlib import Path

import torch

from training import train

VOCAB = 384
WINDOW = 12
HIDDEN = 64
SLIDING, FULL = "sliding_attention", "full_attention"
ROPE = {
    FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
    SLIDING: {"rope_theta": 1e4, "rope_type": "default"},
}
# Gemma 4's special tokens at their real ids; the ids in between are unused placeholders, as
# the real vocabulary has them.
REAL_SPECIAL_IDS = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
    "<|tool>": 46, "<tool|>": 47, "<|tool_call>": 48, "<tool_call|>": 49,
    "<|tool_response>": 50, "<tool_response|>": 51, '<|"|>': 52,
    "<|think|>": 98, "<|channel>": 100, "<channel|>": 101, "<|turn>": 105, "<turn|>": 106,
}
# Media markers and soft tokens, at ids of the tiny vocabulary (the real ones lie past it); the
# tiny multimodal configs name these ids, as the real configs name theirs.
MEDIA_IDS = {
    "<|image>": 60, "<image|>": 61, "<|image|>": 62, "<|audio>": 63, "<audio|>": 64, "<|audio|>": 65,
    "<|video|>": 66,
}
MEDIA_CONFIG = dict(boi_token_id=60, eoi_token_id=61, image_token_id=62, boa_token_id=63, eoa_token_index=64,
                    audio_token_id=65, video_token_id=66)
_BY_ID = {i: name for name, i in {**REAL_SPECIAL_IDS, **MEDIA_IDS}.items()}
SPECIAL_TOKENS = [_BY_ID.get(i, f"<unused{i}>") for i in range(max(_BY_ID) + 1)]
EOS_ID = 1
END_OF_TURN_ID = REAL_SPECIAL_IDS["<turn|>"]
TOOL_RESPONSE_ID = REAL_SPECIAL_IDS["<|tool_response>"]
# Google's published chat template, vendored in tests/data (see its README for the source and
# licence). Every chat-format test renders with it; a missing copy is an error, never a skip.
REFERENCE_TEMPLATE = Path(__file__).resolve().parent / "data" / "gemma4-chat-template.jinja"


def reference_template() -> str:
    """Google's Gemma 4 chat template, as published with the checkpoints."""
    return REFERENCE_TEMPLATE.read_text()


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What time is it in Taipei? And in New York?",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "Gemma runs on a Mac with MLX. The weather is sunny today.",
    "for i in range(10):\n    print(i * i)\n",
    "Hello! How can I help you today? I can answer questions and call tools.",
]


# transformers' keys that the 12B's text config class does not have (no per-layer embeddings,
# no experts).
_NOT_UNIFIED = ("hidden_size_per_layer_input", "vocab_size_per_layer_input")


GLOBAL_HEAD_DIM = 64  # the full layers' head size (32 on sliding ones)


def _text_config(unified: bool = False, **overrides):
    """A tiny Gemma4TextConfig, or with `unified` the 12B's Gemma4UnifiedTextConfig."""
    from transformers import Gemma4TextConfig, Gemma4UnifiedTextConfig

    layer_types = [SLIDING] * 4 + [FULL] + [SLIDING] * 4 + [FULL]
    config = dict(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=HIDDEN,
        intermediate_size=96, num_hidden_layers=len(layer_types), num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, global_head_dim=GLOBAL_HEAD_DIM, hidden_size_per_layer_input=16,
        num_kv_shared_layers=4, sliding_window=WINDOW, final_logit_softcapping=30.0,
        use_double_wide_mlp=True, layer_types=layer_types, rope_parameters=ROPE,
        max_position_embeddings=4096, initializer_range=0.05, pad_token_id=0,
        eos_token_id=[EOS_ID, END_OF_TURN_ID], bos_token_id=2,
    )
    config.update(overrides)
    config["num_hidden_layers"] = len(config["layer_types"])
    if unified:
        return Gemma4UnifiedTextConfig(**{k: v for k, v in config.items() if k not in _NOT_UNIFIED})
    return Gemma4TextConfig(**config)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Give norm scales and layer scalars random values around one, so none is a no-op."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith("layer_scalar"):
                p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.75 + 0.5 * torch.rand(b.shape, generator=g))


def _randomise_media(model: torch.nn.Module, seed: int) -> None:
    """Random values for the media encoders' norm scales (around one) and position tables, which
    transformers initialises to ones: a tower that ignored a position or a norm would pass."""
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name:
                continue
            if p.ndim == 1:
                p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=g))
            elif "position_embedding_table" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


# The structure of each published Gemma 4 size at toy widths (the published configs are quoted
# in the README). "e2b" is `_text_config`'s defaults. E4B: no double-wide MLP, 2 K/V heads, a 5:1
# layer pattern, K/V sharing. 26B-A4B: a mixture-of-experts block beside the MLP, keys equal to
# values on full layers with their own K/V head count, no sharing, no per-layer embeddings. 31B:
# the same attention, dense, no sharing. 12B (transformers' `gemma4_unified` classes): as 31B, a
# 5:1 pattern; "12b-kv-shared" is the 12B's classes with what its config may also ask for (K/V
# sharing with double-wide MLPs on the shared layers, keys apart from values).
_PATTERN_5_1 = [SLIDING] * 5 + [FULL]
_NO_PLE = dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)
_K_EQ_V = dict(attention_k_eq_v=True, num_key_value_heads=2, num_global_key_value_heads=1)
VARIANTS = {
    "e2b": {},
    "e4b": dict(
        hidden_size=96, layer_types=_PATTERN_5_1 * 2, num_kv_shared_layers=4, num_key_value_heads=2,
        use_double_wide_mlp=False,
    ),
    "26b-a4b": dict(
        layer_types=[SLIDING] * 2 + [FULL] + [SLIDING] * 2 + [FULL], num_kv_shared_layers=0,
        use_double_wide_mlp=False, enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=32, **_NO_PLE, **_K_EQ_V,
    ),
    "31b": dict(
        hidden_size=128, layer_types=_PATTERN_5_1 + [SLIDING] * 2 + [FULL], num_kv_shared_layers=0,
        use_double_wide_mlp=False, **_NO_PLE, **_K_EQ_V,
    ),
    "12b": dict(
        hidden_size=128, layer_types=_PATTERN_5_1 * 2, num_kv_shared_layers=0, use_double_wide_mlp=False, **_K_EQ_V,
    ),
    "12b-kv-shared": dict(
        layer_types=_PATTERN_5_1 * 2, num_kv_shared_layers=4, use_double_wide_mlp=True, num_key_value_heads=2,
    ),
}
WITH_AUDIO = ("e2b", "e4b", "12b", "12b-kv-shared")  # the sizes google ships with an audio encoder
UNIFIED = ("12b", "12b-kv-shared")  # built with transformers' gemma4_unified classes
# The assistant of each variant: its target's width and K/V heads; the centroid head or the plain
# one, as the published assistants have (E2B and E4B: centroids; 31B and 12B: plain).
ASSISTANTS = {
    "e2b": dict(ordered=True),
    "e4b": dict(ordered=True, backbone=96, num_key_value_heads=2),
    "26b-a4b": dict(ordered=True, **_K_EQ_V),
    "31b": dict(ordered=False, backbone=128, num_attention_heads=8, **_K_EQ_V),
    "12b": dict(ordered=False, unified=True, backbone=128, **_K_EQ_V),
    "12b-kv-shared": dict(ordered=True, unified=True, num_key_value_heads=2),
}


def build_target(
    folder: Path, layout: str = "text", seed: int = 0, tokenizer: bool = True, variant: str = "e2b"
) -> Path:
    """A tiny target. layout "text": Gemma4ForCausalLM (model_type gemma4_text);
    "google": Gemma4ForConditionalGeneration with a vision tower and (E2B, E4B) an audio tower, as
    google ships it.
    The 12B's variants use the gemma4_unified classes instead (its text model alone, or with
    its encoder-free vision and audio embedders). Both layouts carry the same language-model
    weights for the same seed. `variant` picks the structure of one Gemma 4 size (see VARIANTS)."""
    import transformers

    unified = variant in UNIFIED
    prefix = "Gemma4Unified" if unified else "Gemma4"
    torch.manual_seed(seed)
    text = _text_config(unified, **VARIANTS[variant])
    model = getattr(transformers, f"{prefix}ForCausalLM")(text)
    _randomise(model, seed)
    if layout == "google":
        media = (_tiny_unified_vision(), _tiny_unified_audio()) if unified else (_tiny_vision(), _tiny_audio())
        if variant not in WITH_AUDIO:
            media = (media[0], None)  # 26B-A4B and 31B ship with `audio_config: null`
        config = getattr(transformers, f"{prefix}Config")(
            text_config=text.to_dict(), vision_config=media[0], audio_config=media[1], **MEDIA_CONFIG)
        wrapper = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
        wrapper.model.language_model.load_state_dict(model.model.state_dict())
        _randomise_media(wrapper, seed)
        model = wrapper
    elif layout != "text":
        raise ValueError(layout)
    model.eval().save_pretrained(folder)
    if tokenizer:
        save_tokenizer(folder)
    return Path(folder)


def _tiny_vision() -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64)


def _tiny_audio() -> dict:
    """The first convolution keeps the released 128 channels: transformers sizes the projection
    after the convolutions from them, which fits the 128 mel bands only then."""
    return dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[128, 4],
                output_proj_dims=32, conv_kernel_size=3)


def _tiny_unified_vision() -> dict:
    """The 12B's encoder-free vision embedder: 4-pixel patches merged 2 by 2 (widths that MLX's
    converters can quantize, as mlx-vlm's 12B conversions have them)."""
    return dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=64, mm_posemb_size=16, output_proj_dims=64)


def _tiny_unified_audio() -> dict:
    return dict(audio_embed_dim=64)


def build_assistant(
    folder: Path, ordered: bool = True, seed: int = 1, backbone: int = HIDDEN, unified: bool = False,
    **text_overrides,
) -> Path:
    """A tiny gemma4_assistant drafter for the tiny target (centroid head on or off); `unified`:
    the 12B's gemma4_unified_assistant. Widths are multiples of 64 so that it can be quantized
    with MLX's default group size."""
    import transformers

    prefix = "Gemma4UnifiedAssistant" if unified else "Gemma4Assistant"
    Config, Model = (getattr(transformers, prefix + name) for name in ("Config", "ForCausalLM"))

    torch.manual_seed(seed)
    text = dict(
        vocab_size_per_layer_input=0, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        hidden_size_per_layer_input=0, num_kv_shared_layers=4, final_logit_softcapping=None,
        use_double_wide_mlp=False, layer_types=[SLIDING] * 3 + [FULL],
    )
    text.update(text_overrides)
    config = Config(
        text_config=_text_config(unified, **text).to_dict(), backbone_hidden_size=backbone,
        use_ordered_embeddings=ordered, num_centroids=16, centroid_intermediate_top_k=4,
    )
    model = Model(config)
    _randomise(model, seed)
    if ordered:
        ordering = torch.randperm(config.text_config.vocab_size, generator=torch.Generator().manual_seed(seed))
        model.masked_embedding.token_ordering.copy_(ordering)
    model.generation_config.num_assistant_tokens = 6
    model.eval().save_pretrained(folder)
    return Path(folder)


def build_family_assistant(folder: Path, variant: str, seed: int = 1) -> Path:
    """The tiny assistant for the tiny target of `variant`."""
    return build_assistant(folder, seed=seed, **ASSISTANTS[variant])


def save_tokenizer(folder: Path, chat_template: bool = True) -> None:
    """A byte-level BPE over a small corpus, with Gemma 4's special tokens at their real ids,
    Google's chat template (chat_template=False: none, as a base model or a hand-made
    conversion has), and the real stop tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    assert tok.get_vocab_size() <= VOCAB
    assert all(tok.token_to_id(name) == i for name, i in REAL_SPECIAL_IDS.items())
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", mask_token="<mask>", additional_special_tokens=SPECIAL_TOKENS[5:],
    )
    if chat_template:
        fast.chat_template = reference_template()
    fast.save_pretrained(folder)
    # As the real checkpoints: a tool call ends when the model writes <|tool_response>.
    gen = Path(folder) / "generation_config.json"
    config = json.loads(gen.read_text()) if gen.exists() else {}
    config["eos_token_id"] = [EOS_ID, END_OF_TURN_ID, TOOL_RESPONSE_ID]
    gen.write_text(json.dumps(config, indent=2))


def build_trained_target(folder: Path, examples, steps: int = 150, seed: int = 0) -> Path:
    """A tiny target (with the tokenizer) trained until greedy decoding continues each
    (prompt, continuation) pair of token ids as given: a checkpoint whose model really calls
    tools, thinks and ends its turns, for tests of the chat format end to end."""
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(_text_config(initializer_range=0.02))
    train(model, examples, steps)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return Path(folder)


def save_processor_config(folder: Path) -> Path:
    """A processor_config.json, in transformers' nested layout, whose image processor fits the
    tiny towers' 4-pixel patches, as a real checkpoint's fits its towers. mlx-vlm's converter
    writes the default processor's (16-pixel patches) where the source has none, which the tiny
    vision tower cannot take."""
    config = {"processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_seq_length": 750,
              "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 280,
                                  "patch_size": _tiny_vision()["patch_size"], "pooling_kernel_size": 3},
              "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor"}}
    (Path(folder) / "processor_config.json").write_text(json.dumps(config, indent=2))
    return Path(folder)


def stated_head_size(folder: Path) -> Path:
    """transformers 5.24 saves a tiny config's full-layer head size as a per-layer override, which
    mlx-vlm 0.7.10 does not read (it falls back to 512); the published configs state
    `global_head_dim`, as this makes the tiny one do. Nothing else changes."""
    config = json.loads((Path(folder) / "config.json").read_text())
    config["text_config"]["global_head_dim"] = GLOBAL_HEAD_DIM
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return Path(folder)
