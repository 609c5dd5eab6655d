"""Training a tiny checkpoint until greedy decoding continues given examples (tests/tiny.py's
Gemma 4, tests/tiny_qwen.py's Qwen3.5): a checkpoint whose model really writes its family's tool
calls, thoughts and turn ends, for tests of a chat format end to end."""

import torch


def train(model: torch.nn.Module, examples, steps: int) -> None:
    """Train `model` in place until greedy decoding continues each (prompt, continuation) pair of
    token ids as given (the loss on the continuations only); left in eval mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and others share the machine
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    batch = []
    for prompt, continuation in examples:
        ids = torch.tensor([list(prompt) + list(continuation)])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100  # learn the answers only
        batch.append((ids, labels))
    model.train()
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            sum(model(input_ids=ids, labels=labels).loss for ids, labels in batch).backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
