"""The Gemma 4 family: E2B, E4B, 26B-A4B, 31B and the 12B, with their MTP assistants.

facts.py: the model's facts (layer kinds, K/V sources, configs as mlx-lm reads them, the K/V
cache's size); sizes.py: the sizes by name; target.py: the target over mlx-lm's model (its
pass over the loop's rows is models/batch_pass.py's); media_prefill.py: images and audio in a
prefill; assistant.py: the MTP drafter; loader.py: loading both and checking a pair;
chat_format.py: channels and tool calls as Gemma 4 writes them; tensor_parallel.py: both
split over a group of processes.
"""

from ...media.loading import load_media
from ..registry import Family
from .chat_format import CHAT_FORMAT
from .facts import context_of, kv_cache_bytes
from .loader import (
    DRAFTER_TYPES,
    TARGET_TYPES,
    check_pair,
    drafter_for,
    drafter_from,
    target_from,
)
from .sizes import SIZES, size_of
from .tensor_parallel import check_drafter_split, check_split, rank_share, split_pair

FAMILY = Family(
    name="Gemma 4",
    target_types=TARGET_TYPES,
    drafter_types=DRAFTER_TYPES,
    load_target=target_from,
    chat_format=CHAT_FORMAT,
    load_drafter=drafter_from,
    check_pair=check_pair,
    drafter_for=drafter_for,
    sizes=SIZES,
    size_of=lambda target: size_of(vars(target.args)),
    load_media=load_media,
    kv_cache_bytes=kv_cache_bytes,
    context_of=context_of,
    check_split=check_split,
    check_drafter_split=check_drafter_split,
    split=split_pair,
    rank_share=rank_share,
)

__all__ = ["FAMILY"]
