"""Whether another row fits: the memory check of a batch, which counts rows x context.

The batch keeps every row's full-attention K/V in one buffer per layer, as wide as its longest
row (models/batch_cache.py), so B rows of which the longest may reach N positions take about
B x kv_bytes(N): the family's own count of a sequence's K/V (memory.py, the sliding layers at
their window). The budget is what this machine lets the process use, less the weights and the
prompt cache's bound. A job is admitted while the rows running and it fit the budget; otherwise
it waits for a row to end. A job that would not fit alone is refused by name.

Under a group each rank holds its share of every row's K/V (the heads it keeps: memory.py), and
the budget is the smallest rank's, so that what rank 0 admits fits on every rank.
"""

from typing import Callable, List, Optional

from mlx.utils import tree_flatten

from ..memory import available_bytes, kv_cache_bytes, size_text

# Memory kept free beside the weights, the K/V and the prompt cache: activations of a prefill
# chunk, compiled graphs, the media towers' working memory.
HEADROOM = 0.1


class KVRoom:
    def __init__(self, bytes_at: Callable[[int], int], budget: int):
        self.bytes_at, self.budget = bytes_at, budget

    @classmethod
    def for_engine(cls, engine, cache_bytes: int, budget: Optional[int] = None) -> "KVRoom":
        """The room on this machine for `engine`'s rows, or in `budget` bytes when given."""
        config, ranks = engine.pair.target_config, engine.lockstep.size

        def bytes_at(positions: int) -> int:
            counted = kv_cache_bytes(config, max(positions, 1), ranks=ranks)
            return counted if counted is not None else 0  # a family that cannot count: unbounded

        if budget is None:
            weights = sum(a.nbytes for _, a in tree_flatten(engine.target.model.parameters()))
            if engine.assistant is not None:
                weights += sum(a.nbytes for _, a in tree_flatten(engine.assistant.parameters()))
            budget = int(available_bytes() * (1 - HEADROOM)) - weights - cache_bytes
        return cls(bytes_at, int(engine.lockstep.least(budget)))

    def fits(self, positions: List[int]) -> bool:
        """Whether rows reaching these positions fit together."""
        return len(positions) * self.bytes_at(max(positions)) <= self.budget

    def fits_alone(self, positions: int) -> bool:
        return self.fits([positions])

    def most_alone(self, at_most: int) -> int:
        """The most positions, up to `at_most`, whose K/V one row fits in (0: none)."""
        low, high = 0, at_most
        while low < high:  # (the K/V grows with the positions)
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.fits_alone(middle) else (low, middle - 1)
        return low


def too_big(room: KVRoom, positions: int) -> str:
    """The words for a request whose K/V would not fit even alone."""
    return (f"This request may reach {positions} positions, whose K/V cache would take "
            f"{size_text(room.bytes_at(positions))}, and this server has {size_text(max(room.budget, 0))} for "
            f"K/V beside its weights and prompt cache. Please reduce the length of the messages or max_tokens.")


def no_room(budget: int, cache_bytes: int) -> str:
    """The words for a server whose memory leaves no room for any request's K/V."""
    if budget > 0:
        return (f"the memory left for the requests' K/V cache is {size_text(budget)}, beside the weights and "
                f"{cache_bytes / 1e9:g} GB of prompt cache: too little for any request (lower --cache-gb)")
    # (the budget itself, negative, read as nonsense: "-99977.25 GB")
    return (f"the prompt cache ({cache_bytes / 1e9:g} GB) takes all the memory left beside the weights "
            f"({size_text(max(budget + cache_bytes, 0))}): none is left for the requests' K/V cache (lower --cache-gb)")
