"""Qwen3.5 and Qwen3.6 (dense and mixture of experts), with the MTP layer in the target's own
checkpoint: the second family (issue: Qwen).

- loader.py: the target through mlx-lm's own network, and the MTP layer from the checkpoint's
  `mtp.` weights (mtp.py), each checked against transformers;
- recurrent.py and storage.py: the Gated DeltaNet layers' state, rolled back per row of the
  loop's storage when guesses are rejected (a pass replays what its rows kept of the last one);
- target.py: the target behind models/protocol.py's `TargetModel`, its batch pass compiled;
- chat_format.py: thoughts and Qwen3-Coder's XML tool calls; facts.py: the memory it needs;
  sizes.py: the sizes by name (4-bit targets, their MTP layers split into folders of their own);
- tensor_parallel.py: the target and its MTP layer split over a group of processes.

- mtp.py and drafter.py: the MTP layer, its K/V written by the target's passes (one slot per
  target position, so it trims with them), and its draft steps (drafting/mtp.py drives them).

The loop decodes it exactly (tests/test_qwen_rows.py: transformers' greedy answers with every
count of kept guesses, rows of a batch, marks); the drafts are the reference MTP head's
(tests/test_qwen_mtp.py).
"""

from ..registry import Family
from .chat_format import CHAT_FORMAT
from .facts import context_of, kv_cache_bytes
from .loader import DRAFTER_TYPES, TARGET_TYPES, check_pair, drafter_for, drafter_from, join, load_target
from .sizes import SIZES
from .tensor_parallel import check_split, rank_share, split_pair

FAMILY = Family(
    name="Qwen3.5",
    target_types=TARGET_TYPES,
    drafter_types=DRAFTER_TYPES,  # the MTP layer in the target's own checkpoint, or split into its own
    load_target=load_target,
    chat_format=CHAT_FORMAT,
    load_drafter=drafter_from,
    check_pair=check_pair,
    join=join,
    drafter_for=drafter_for,
    sizes=SIZES,
    kv_cache_bytes=kv_cache_bytes,
    context_of=context_of,
    check_split=check_split,
    split=split_pair,
    rank_share=rank_share,
)

__all__ = ["FAMILY"]
