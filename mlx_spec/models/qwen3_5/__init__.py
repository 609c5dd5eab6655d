"""Qwen3.5 and Qwen3.6 (dense and mixture of experts), with the MTP layer in the target's own
checkpoint: the second family (issue: Qwen).

- loader.py: the target through mlx-lm's own network, and the MTP layer from the checkpoint's
  `mtp.` weights (mtp.py), each checked against transformers;
- recurrent.py and storage.py: the Gated DeltaNet layers' state, rolled back per row of the
  loop's storage when guesses are rejected (a pass replays what its rows kept of the last one);
- target.py: the target behind models/protocol.py's `TargetModel`, its batch pass compiled;
- chat_format.py: thoughts and Qwen3-Coder's XML tool calls; facts.py: the memory it needs.

The loop decodes it exactly (tests/test_qwen_rows.py: transformers' greedy answers with every
count of kept guesses, rows of a batch, marks), drafting by prompt lookup. Its MTP drafter (a
layer with K/V of its own, in the storage beside the target's) comes next: until then the
family names no drafter, and `drafter="auto"` drafts by lookup alone.
"""

from ..registry import Family
from .chat_format import CHAT_FORMAT
from .facts import context_of, kv_cache_bytes
from .loader import TARGET_TYPES, load_target

FAMILY = Family(
    name="Qwen3.5",
    target_types=TARGET_TYPES,
    drafter_types=(),
    load_target=load_target,
    chat_format=CHAT_FORMAT,
    kv_cache_bytes=kv_cache_bytes,
    context_of=context_of,
)

__all__ = ["FAMILY"]
