"""Compiled functions, kept per key and bounded: one mechanism for every `mx.compile` we use.

`mx.compile` records a graph (a trace) for each input shape it sees and keeps it as long as the
compiled function lives. Our compiled functions depend on sampling settings (a graph per
temperature, top-k and top-p) and on the caches' buffer shapes, which differ from conversation
to conversation. A server lives for weeks and its callers send settings nobody foresaw, so every
compiled function is held here under a key naming what its graph depends on (settings and input
shapes: one trace per key), and the least recently used go once a cache holds `bound` of them.
Dropping one frees its trace; using its key again traces it anew.
"""

from collections import OrderedDict
from typing import Callable, Hashable

import mlx.core as mx

# Traces each owner keeps (a model owns one cache for its pass, its drafter's steps and the
# acceptance test): a few sampling settings in use at once, times the pass lengths (g + 1) and
# buffer shapes of the conversations under way.
MAX_TRACES = 192


class TraceCache:
    def __init__(self, bound: int = MAX_TRACES):
        if bound < 1:
            raise ValueError(f"a trace cache holds at least one function, got bound {bound}")
        self.bound = bound
        self._functions: "OrderedDict[Hashable, Callable]" = OrderedDict()
        # Compiled functions this cache made so far. A function traces its graph at its first
        # call, which follows its making at once: work during which this grew paid for a trace.
        self.made = 0

    def get(self, key: Hashable, make: Callable[[], Callable]) -> Callable:
        """The compiled function for `key`: `mx.compile(make())` the first time (and again after
        it was evicted), the one held since then otherwise."""
        function = self._functions.get(key)
        if function is not None:
            self._functions.move_to_end(key)  # now the most recently used
            return function
        function = self._functions[key] = mx.compile(make())
        self.made += 1
        while len(self._functions) > self.bound:
            self._functions.popitem(last=False)
        return function

    def clear(self) -> None:
        self._functions.clear()

    def __len__(self) -> int:
        return len(self._functions)


def shapes_of(arrays) -> tuple:
    """A hashable description of input arrays' shapes and dtypes, for a key."""
    return tuple((tuple(a.shape), a.dtype) for a in arrays)
