"""The Gemma 4 MTP assistant (``model_type: gemma4_assistant``, and the 12B's
``gemma4_unified_assistant``, the same network) in MLX.

One draft step reads the target's scaled embedding of the last token and a 1536-wide hidden
state, projects them to the drafter's width, runs four decoder layers whose attention has
queries only (keys and values come from the target's caches), and returns the drafter's own
final hidden state `h` (for the logits) and its projection back to the target's width (the
hidden state of the next step).

The decoder layers are mlx-lm's Gemma 4 layers configured as all-K/V-shared; we only add the
projections and the heads.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gemma4_text import DecoderLayer, ModelArgs

from ..protocol import SharedKV
from .facts import FULL, SLIDING

# transformers' default target width per assistant type, for a config that leaves it out.
DEFAULT_BACKBONE = {"gemma4_assistant": 1536, "gemma4_unified_assistant": 3840}


@dataclass
class AssistantConfig:
    text: ModelArgs
    backbone_hidden_size: int
    use_ordered_embeddings: bool
    num_centroids: int
    centroid_intermediate_top_k: int
    tie_word_embeddings: bool = True
    num_assistant_tokens: int = 6

    @classmethod
    def from_dict(cls, config: dict, generation_config: Optional[dict] = None) -> "AssistantConfig":
        text = dict(config["text_config"])
        # Every layer reads the target's K/V; the drafter computes none of its own.
        text["num_kv_shared_layers"] = text["num_hidden_layers"]
        text["hidden_size_per_layer_input"] = 0
        text["use_double_wide_mlp"] = False
        generation_config = generation_config or {}
        return cls(
            text=ModelArgs.from_dict(text),
            backbone_hidden_size=config.get("backbone_hidden_size", DEFAULT_BACKBONE.get(config.get("model_type"), 1536)),
            use_ordered_embeddings=config.get("use_ordered_embeddings", False),
            num_centroids=config.get("num_centroids", 2048),
            centroid_intermediate_top_k=config.get("centroid_intermediate_top_k", 32),
            tie_word_embeddings=config.get("tie_word_embeddings", True),
            num_assistant_tokens=int(generation_config.get("num_assistant_tokens", 6)),
        )


class _Inner(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class MaskedEmbedding(nn.Module):
    """Centroid head: score `num_centroids` clusters, keep the top k, and score only the tokens
    of those clusters (`token_ordering` lists the tokens cluster by cluster)."""

    def __init__(self, config: AssistantConfig):
        super().__init__()
        self.top_k = config.centroid_intermediate_top_k
        self.num_centroids = config.num_centroids
        self.centroids = nn.Linear(config.text.hidden_size, config.num_centroids, bias=False)
        self.token_ordering = mx.zeros((config.text.vocab_size,), dtype=mx.int32)

    def candidates(self, h: mx.array) -> mx.array:
        """Candidate token ids [..., top_k * vocab / num_centroids] for drafter states `h`."""
        scores = self.centroids(h)
        top = mx.argpartition(-scores, kth=self.top_k - 1, axis=-1)[..., : self.top_k]
        clusters = self.token_ordering.reshape(self.num_centroids, -1)
        ids = clusters[top]  # [..., top_k, vocab_per_cluster]
        return ids.reshape(*ids.shape[:-2], -1)


class Assistant(nn.Module):
    def __init__(self, config: AssistantConfig):
        super().__init__()
        args = config.text
        self.config = config
        self.model = _Inner(args)
        self.pre_projection = nn.Linear(2 * config.backbone_hidden_size, args.hidden_size, bias=False)
        self.post_projection = nn.Linear(args.hidden_size, config.backbone_hidden_size, bias=False)
        if not config.tie_word_embeddings:
            # An Embedding, not a Linear: the centroid head gathers rows of it by token id.
            self.lm_head = nn.Embedding(args.vocab_size, args.hidden_size)
        if config.use_ordered_embeddings:
            self.masked_embedding = MaskedEmbedding(config)

    @property
    def layer_types(self):
        return self.config.text.layer_types

    @property
    def vocab_size(self) -> int:
        return self.config.text.vocab_size

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        out = {}
        for k, v in weights.items():
            if k == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # tied to model.embed_tokens
            if k.endswith("token_ordering"):
                v = v.astype(mx.int32)
            out[k] = v
        return out

    def kv_inputs(self, kv: Dict[str, SharedKV]) -> Tuple[mx.array, ...]:
        """What a draft step reads of the target's K/V (`Target.drafter_buffers`): the sliding
        source layer's buffer with a mask of its last `sliding_span` settled positions, and the
        full source layer's with a mask of every settled one. The buffers stay whole, so that a
        compiled step keeps its input shapes from cycle to cycle."""
        sliding, full = kv[SLIDING].last(self.sliding_span), kv[FULL]
        return sliding.keys, sliding.values, sliding.mask(), full.keys, full.values, full.mask()

    def carry(self, hidden: mx.array, kv: Tuple[mx.array, ...], steps: int) -> mx.array:
        """What a round's first step takes: the target's hidden state (each step hands the next
        its projection; the assistant keeps nothing else between steps)."""
        return hidden

    def step(self, token_embedding: mx.array, hidden: mx.array, kv: Tuple[mx.array, ...],
             position) -> Tuple[mx.array, mx.array]:
        """One draft step for a single position.

        token_embedding: the target's scaled embedding of the last token [B, 1, backbone].
        hidden: the target's (or the previous step's) hidden state [B, 1, backbone].
        kv: `kv_inputs` of the target's K/V.
        position: the RoPE position of the query, held constant for the round.
        Returns (h, next_hidden): the drafter's final-norm state and its projection.
        """
        sliding_keys, sliding_values, sliding_mask, full_keys, full_values, full_mask = kv
        shared = {SLIDING: (sliding_keys, sliding_values), FULL: (full_keys, full_values)}
        masks = {SLIDING: sliding_mask, FULL: full_mask}
        x = self.pre_projection(mx.concatenate([token_embedding, hidden], axis=-1))
        offset = mx.array(position) if isinstance(position, int) else position
        for layer, layer_type in zip(self.model.layers, self.layer_types):
            # A single query sees all the K/V its mask leaves.
            x, _, _ = layer(x, masks[layer_type], None, shared_kv=shared[layer_type], offset=offset)
        h = self.model.norm(x)
        return h, self.post_projection(h)

    @property
    def sliding_span(self) -> int:
        """Positions a sliding layer reads: its own window (transformers' bidirectional window
        mask), which may be shorter than the target's."""
        return self.config.text.sliding_window + 1

    @property
    def head(self) -> nn.Module:
        return self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head

    def candidate_logits(self, h: mx.array) -> Tuple[mx.array, mx.array]:
        """(ids, logits) of the centroid head's candidates for states `h` [B, 1, D]."""
        ids = self.masked_embedding.candidates(h)  # [B, 1, C]
        rows = self.head(ids)  # [B, 1, C, D]
        logits = (rows @ h[..., :, None])[..., 0]
        return ids, logits

    def full_logits(self, h: mx.array) -> mx.array:
        """Logits over the whole vocabulary. With ordered embeddings, tokens outside the chosen
        clusters get -inf (probability zero)."""
        if not self.config.use_ordered_embeddings:
            return self.head.as_linear(h)
        ids, logits = self.candidate_logits(h)
        out = mx.full((*h.shape[:-1], self.vocab_size), -mx.inf, dtype=logits.dtype)
        return mx.put_along_axis(out, ids, logits, axis=-1)

    def greedy_token(self, h: mx.array) -> mx.array:
        """Argmax token [B, 1]; ties go to the lowest id. The centroid head never builds the
        full-vocabulary logits."""
        if not self.config.use_ordered_embeddings:
            return mx.argmax(self.full_logits(h), axis=-1)
        ids, logits = self.candidate_logits(h)
        best = logits == logits.max(axis=-1, keepdims=True)
        return mx.where(best, ids, self.vocab_size).min(axis=-1)

