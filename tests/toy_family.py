"""A second model family, made only of the seam: mlx-lm's Llama as a target behind
models/protocol.py's `TargetModel`, with no MTP drafter (prompt lookup drafts for it), a chat
format without channels, and a `Family` entry. Nothing of mlx-spec is edited to add it: a
registry with it is passed to `mlx_spec.load`.

`save_toy_checkpoint` writes a tiny random Llama in mlx-lm's own layout, under a model type of
its own (`toy_llama`), so that only this family can load it.
"""

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from mlx_spec.errors import SettingsError
from mlx_spec.models import Family
from mlx_spec.models.cache import FullCache
from mlx_spec.models.checkpoint import Checkpoint
from mlx_spec.models.batch_cache import BatchCaches, sliding_windows
from mlx_spec.models.batch_pass import BatchPass
from mlx_spec.models.protocol import ANSWER
from mlx_spec.models.traces import TraceCache

TOY_TYPE = "toy_llama"
CONFIG = dict(model_type=TOY_TYPE, hidden_size=64, num_hidden_layers=3, intermediate_size=128,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300,
              rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=4096)


def save_toy_checkpoint(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    # Sharper than the default initialisation: greedy decoding then varies and comes back to
    # earlier runs now and then (guesses kept and lost), where the default falls into one token.
    model.update({"model": {"embed_tokens": {"weight": model.model.embed_tokens.weight * 16}}})
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


class ToyTarget:
    """mlx-lm's Llama as a `TargetModel`: full-attention caches, the plain pass for prefill, and
    the package's compiled pass over the loop's storage (any mlx-lm model) for the steps."""

    def __init__(self, model: llama.Model):
        self.model = model
        self.vocab_size = model.args.vocab_size
        self.hidden_size = model.args.hidden_size
        self.context_length = model.args.max_position_embeddings
        self.traces = TraceCache()
        self._batch_pass = BatchPass(self, self.traces)

    def make_cache(self, max_trim: int) -> list:
        return [FullCache() for _ in self.model.layers]  # full attention trims any number

    def hidden(self, tokens, cache):
        return self.model.model(tokens, cache=cache)

    def logits(self, hidden):
        return self.model.lm_head(hidden)

    def forward(self, tokens, cache):
        hidden = self.hidden(tokens, cache)
        return self.logits(hidden), hidden

    def batch_caches(self, max_trim, max_pass):
        return BatchCaches(sliding_windows(self.make_cache(max_trim)), max_trim, max_pass)

    def forward_batch(self, tokens, caches, offsets=None):
        return self._batch_pass(tokens, caches, offsets)

    def batch_drafter_buffers(self, caches, end=None):
        return {}

    def prefill(self, tokens, cache, chunk, spans=(), start=0):
        if spans:
            raise SettingsError("the toy family takes no media")
        hidden = None
        for lo in range(0, tokens.shape[1], chunk):
            if hidden is not None:
                mx.eval([c.keys for c in cache] + [c.values for c in cache])
            hidden = self.hidden(tokens[:, lo:lo + chunk], cache)
        return hidden[:, -1:]

    def embed(self, tokens):
        return self.model.model.embed_tokens(tokens)

    def drafter_buffers(self, cache):
        return {}  # no MTP drafter reads this family's K/V


def load_toy(checkpoint: Checkpoint) -> ToyTarget:
    from mlx_lm.utils import load_model

    model, _ = load_model(checkpoint.path, get_model_classes=lambda config: (llama.Model, llama.ModelArgs))
    return ToyTarget(model)


class PlainChatFormat:
    """Text in, text out: no channels, no tool calls."""

    @staticmethod
    def for_template(messages):
        return messages

    @staticmethod
    def channels(tokenizer, prompt=()):
        class Answer:
            @staticmethod
            def feed(token, piece):
                return ANSWER, piece

        return Answer()

    @staticmethod
    def parse_tool_calls(text, tools=None):
        return []

    @staticmethod
    def assistant_message(text, tool_calls, thinking=""):
        return {"role": "assistant", "content": text}


def kv_cache_bytes(config, context, sliding_slack):
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * context * 4


TOY = Family(name="Toy Llama", target_types=(TOY_TYPE,), drafter_types=(), load_target=load_toy,
             chat_format=PlainChatFormat(), kv_cache_bytes=kv_cache_bytes)
