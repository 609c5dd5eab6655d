"""A tiny Qwen3.5 pair whose guesses are kept as a real pair's are, for tests and benchmarks of
acceptance (a random MTP layer keeps next to nothing).

The target is trained on a made-up language: each token follows from the two before it (one
successor 85% of the time, another 15%), over a small alphabet. Its MTP layer is distilled from
it as Qwen trains one: given (h_t, x_{t+1}), the target's distribution at t + 1. Greedy, the first
guess is kept nearly always; deeper guesses (the layer reading its own output, on which it was
never trained) less: all, none and every count between in one run. The layer knows x_t only
through h_t, so a drafter that loses the target's hidden state keeps about one first guess in ten.
"""

import json
from pathlib import Path

import torch

import tiny_qwen

FIRST = 8  # the alphabet's first id (below it: the tokenizer's specials)
LETTERS = 24
LIKELY = 0.85


class Language:
    """The made-up language: `text(n, generator)` draws n tokens of it."""

    def __init__(self, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(FIRST, FIRST + LETTERS, (FIRST + LETTERS, FIRST + LETTERS, 2), generator=generator)
        self.odds = torch.tensor([LIKELY, 1 - LIKELY])

    def text(self, n: int, generator: torch.Generator) -> list:
        tokens = torch.randint(FIRST, FIRST + LETTERS, (2,), generator=generator).tolist()
        while len(tokens) < n:
            which = int(torch.multinomial(self.odds, 1, generator=generator))
            tokens.append(int(self.successors[tokens[-2], tokens[-1], which]))
        return tokens


def build(folder: Path, target_steps: int = 300, layer_steps: int = 150, seed: int = 0) -> Path:
    """The pair in `folder`, in Qwen's layout (the MTP layer under `mtp.` in the target's own
    checkpoint), with tests/tiny_qwen.py's tokenizer."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForCausalLM

    folder, language = Path(folder), Language(seed)
    generator = torch.Generator().manual_seed(seed + 1)

    def batch() -> torch.Tensor:
        return torch.tensor([language.text(64, generator) for _ in range(16)])

    def next_token_loss(model) -> torch.Tensor:
        ids = batch()
        return model(input_ids=ids, labels=ids).loss
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and others share the machine
    try:
        config = tiny_qwen.text_config()
        torch.manual_seed(seed)
        target = Qwen3_5ForCausalLM(config)
        tiny_qwen._randomise(target, seed)
        _fit(target, target_steps, next_token_loss)
        target.eval()
        layer = tiny_qwen.ReferenceMTP(config)
        tiny_qwen._randomise(layer, seed + 100)
        _fit(layer, layer_steps, lambda head: _distillation_loss(target, head, batch()))
    finally:
        torch.set_num_threads(threads)
    target.save_pretrained(folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights.update({f"mtp.{k}": v.contiguous() for k, v in layer.state_dict().items() if not k.startswith("rotary.")})
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(saved, mtp_num_hidden_layers=1), indent=2))
    tiny_qwen.save_tokenizer(folder)
    return folder


def _fit(module: torch.nn.Module, steps: int, loss_of) -> None:
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    module.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss_of(module).backward()
        optimizer.step()
    module.eval()


def _distillation_loss(target, layer, ids: torch.Tensor) -> torch.Tensor:
    """KL from the target's distribution at t + 1 to the layer's, given (h_t, x_{t+1})."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        wanted = torch.log_softmax(out.logits[:, 1:], dim=-1)
        hidden = out.hidden_states[-1][:, :-1]  # after the final norm
    positions = torch.arange(ids.shape[1] - 1)
    embeddings = target.model.embed_tokens(ids[:, 1:])
    guessed = torch.cat([layer(embeddings[b:b + 1], hidden[b:b + 1], positions) for b in range(ids.shape[0])])
    scores = torch.log_softmax(target.lm_head(guessed), dim=-1)
    return torch.nn.functional.kl_div(scores, wanted, log_target=True, reduction="batchmean") / positions.numel()
