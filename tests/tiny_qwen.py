"""Tiny random Qwen3.5 checkpoints, dense and mixture of experts, built and saved with
transformers (the reference), with the MTP layer that transformers itself drops on load.

They keep the real structure at toy widths: Gated DeltaNet layers with a full-attention layer
every `FULL_EVERY` (gated attention, q/k norms, partial RoPE), (1 + w) norms, the MoE's fused
experts and shared expert. Every parameter is randomised, norm weights too (transformers starts
them at zero, where a missing or doubled (1 + w) shift could hide).

The MTP layer is Qwen's own layout, saved under `mtp.` beside the target's weights as Qwen's
checkpoints hold it: `fc` (2H -> H), `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, one
full-attention decoder layer of the target's kind (`layers.0`) and `norm`. Its reference
(`ReferenceMTP`) is built from transformers' own decoder layer and norms, so the formula under
test is the one vLLM's qwen3_5_mtp.py computes: fc(concat[norm_e(embed(x_{t+1})), norm_h(h_t)]),
the layer, mtp.norm, the target's head; h_t the target's hidden state after its final norm.
"""

import copy
import json
from pathlib import Path

import torch

from training import train

VOCAB = 320
HIDDEN = 64
DATA = Path(__file__).resolve().parent / "data"
# Qwen's own templates, vendored byte for byte (tests/data/README.md says where from).
TEMPLATES = {"3.5": DATA / "qwen3.5-chat-template.jinja", "3.6": DATA / "qwen3.6-chat-template.jinja"}
# Qwen3.5's special and added tokens, by name (their real ids lie past the tiny vocabulary; the
# product reads every id from the tokenizer).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the weather in Paris? Call the tool.",
    "user\nassistant\nsystem\n<function=lookup_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
    "def add(a, b):\n    return a + b\n",
    "# Tools\n\nYou have access to the following functions:\n\n",
]
FULL_EVERY = 4  # layers 3 and 7 of 8 attend fully; the others are Gated DeltaNet


def text_config(moe: bool = False, **overrides):
    """A tiny Qwen3.5 text config (the MoE's with `moe`), in transformers' classes."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    fields = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
        full_attention_interval=FULL_EVERY, tie_word_embeddings=False, eos_token_id=1, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )
    if moe:
        fields.update(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2)
        return Qwen3_5MoeTextConfig(**{**fields, **overrides})
    return Qwen3_5TextConfig(intermediate_size=96, **{**fields, **overrides})


class ReferenceMTP(torch.nn.Module):
    """Qwen3.5's MTP layer from transformers' own pieces: what a draft position computes."""

    def __init__(self, config):
        super().__init__()
        moe = "moe" in config.model_type
        if moe:
            from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling
        else:
            from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling
        prefix = "Qwen3_5Moe" if moe else "Qwen3_5"
        norm = getattr(modeling, f"{prefix}RMSNorm")
        one_layer = copy.deepcopy(config)
        one_layer.layer_types = ["full_attention"]
        one_layer.num_hidden_layers = 1
        one_layer._attn_implementation = "eager"
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.pre_fc_norm_embedding = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = torch.nn.ModuleList([getattr(modeling, f"{prefix}DecoderLayer")(one_layer, 0)])
        self.norm = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = getattr(modeling, f"{prefix}TextRotaryEmbedding")(config)

    def forward(self, next_embeddings: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The MTP layer's output after `mtp.norm`, [1, L, H], for each position t of `positions`
        [L]: token t+1's embedding and the target's hidden state at t, attending causally over
        the positions before it in this call (the layer's own K/V)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeddings), self.pre_fc_norm_hidden(hidden)], dim=-1))
        n = x.shape[1]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        position_ids = positions[None]
        x = self.layers[0](x, position_embeddings=self.rotary(x, position_ids), attention_mask=causal,
                           position_ids=position_ids)
        return self.norm(x[0] if isinstance(x, tuple) else x)


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random, norms near one (as trained (1 + w) norms' w are small) but not one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=generator) * 2.0)
            elif p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.0 / p.shape[-1]) ** 0.5)


def build(folder: Path, moe: bool = False, layout: str = "text", seed: int = 0, mtp: bool = True,
          examples=None, steps: int = 120, **overrides) -> Path:
    """A tiny target checkpoint in `folder`: transformers' weights and config, and the MTP
    layer's weights under `mtp.` (unless `mtp` is False), config.json saying
    `mtp_num_hidden_layers` as Qwen's do. layout "text": Qwen3_5ForCausalLM's keys (`model.*`);
    "multimodal": Qwen's published layout, the text model under `model.language_model.` and the
    config's text fields under `text_config` (no vision weights: nothing here reads them)."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    folder = Path(folder)
    config = text_config(moe, **overrides)
    torch.manual_seed(seed)
    model = (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)(config)
    _randomise(model, seed)
    if examples:
        train(model, examples, steps)
    model.eval().save_pretrained(folder)
    weights = fused_experts(load_file(str(folder / "model.safetensors")))
    if mtp:
        head = ReferenceMTP(config)
        _randomise(head, seed + 100)
        weights.update({f"mtp.{k}": v.contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")})
    saved = json.loads((folder / "config.json").read_text())
    if mtp:
        saved["mtp_num_hidden_layers"] = 1
    if layout == "multimodal":
        weights = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
                   for k, v in weights.items()}
        text = {**saved, "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text"}
        text.pop("architectures", None)
        saved = {"model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text,
                 "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
                 "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(saved, indent=2))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def save_tokenizer(folder: Path, version: str = "3.5") -> Path:
    """A byte-level BPE over a small corpus (as Qwen2Tokenizer is), Qwen's special and added
    tokens, Qwen's own chat template of `version` ("3.5" or "3.6"), and the stop tokens Qwen's
    generation_config.json names (<|im_end|>, <|endoftext|>)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.get_vocab_size() <= VOCAB
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATES[version].read_text()
    fast.save_pretrained(folder)
    stops = [fast.convert_tokens_to_ids("<|im_end|>"), fast.convert_tokens_to_ids("<|endoftext|>")]
    (Path(folder) / "generation_config.json").write_text(json.dumps({"eos_token_id": stops, "pad_token_id": stops[1]}))
    return Path(folder)


def split_mtp(folder: Path, out: Path) -> Path:
    """The MTP layer of a tiny checkpoint split into a drafter folder of its own, in the layout
    mlx-vlm's splitter writes (its qwen3_5_mtp README and split.py): config.json with
    `model_type: "qwen3_5_mtp"` and the target's text config under `text_config`; the layer's
    weights without the `mtp.` prefix, the fused experts split into `switch_mlp`, and every
    (1 + w) norm stored shifted."""
    from safetensors.torch import load_file, save_file

    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
             "norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
    weights = {}
    for key, value in load_file(str(Path(folder) / "model.safetensors")).items():
        if not key.startswith("mtp."):
            continue
        key = key[len("mtp."):]
        if key.endswith(".experts.gate_up_proj"):
            prefix, middle = key[: -len(".experts.gate_up_proj")], value.shape[-2] // 2
            weights[f"{prefix}.switch_mlp.gate_proj.weight"] = value[..., :middle, :].contiguous()
            weights[f"{prefix}.switch_mlp.up_proj.weight"] = value[..., middle:, :].contiguous()
        elif key.endswith(".experts.down_proj"):
            weights[key.replace(".experts.down_proj", ".switch_mlp.down_proj.weight")] = value
        else:
            weights[key] = value + 1.0 if value.ndim == 1 and key.endswith(norms) else value
    config = json.loads((Path(folder) / "config.json").read_text())
    text = config.get("text_config", config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp", "text_config": text, "block_size": 3,
                                                 "tie_word_embeddings": text.get("tie_word_embeddings", False)}))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "mlx"})
    return out


def fused_experts(weights: dict) -> dict:
    """The experts as Qwen3.5's MoE checkpoints hold them (and vLLM and mlx-lm read them):
    `experts.gate_up_proj` [E, 2I, H] (gate first) and `experts.down_proj` [E, H, I], where
    transformers 5.24 saves one tensor per expert."""
    fused, experts = {}, {}
    for key, value in weights.items():
        head, sep, tail = key.partition(".experts.")
        if not sep:
            fused[key] = value
            continue
        index, kind = tail.split(".")[:2]
        experts.setdefault(head, {}).setdefault(kind, {})[int(index)] = value
    for head, kinds in experts.items():
        count = len(kinds["gate_proj"])
        fused[f"{head}.experts.gate_up_proj"] = torch.stack(
            [torch.cat([kinds["gate_proj"][e], kinds["up_proj"][e]], dim=0) for e in range(count)])
        fused[f"{head}.experts.down_proj"] = torch.stack([kinds["down_proj"][e] for e in range(count)])
    return fused


def reference(folder: Path, moe: bool = False):
    """(transformers' model as it loads the checkpoint, the reference MTP with the checkpoint's
    `mtp.` weights), both in eval mode."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    folder = Path(folder)
    saved = json.loads((folder / "config.json").read_text())
    if "text_config" in saved:
        raise ValueError("the reference loads the text layout (build(..., layout='text'))")
    model = (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM).from_pretrained(folder, dtype=torch.float32).eval()
    head = ReferenceMTP(model.config)
    weights = {k[len("mtp."):]: v for k, v in load_file(str(folder / "model.safetensors")).items() if k.startswith("mtp.")}
    missing, unexpected = head.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if not k.startswith("rotary.")]:
        raise ValueError(f"the MTP weights do not fit the reference: missing {missing}, unexpected {unexpected}")
    return model, head.eval()
