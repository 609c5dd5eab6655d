"""Uniforms indexed by output position, one stream per use, all from one seed."""

import os
from typing import Optional

import mlx.core as mx


class UniformStream:
    """Pairs of uniforms in [0, 1) indexed by output position, drawn in blocks from one key.

    Indexing by position (not by draw order) is what makes the match rule give the same tokens
    with and without drafting for the same seed.
    """

    block = 1024

    def __init__(self, key: mx.array):
        self._key = key
        self._blocks = []

    def take(self, start: int, n: int, ahead: Optional[mx.array] = None, most: int = 0) -> mx.array:
        """Uniforms [n, 2] for output positions start .. start + n - 1. For a cycle built ahead
        of the host, the positions start `ahead` later: a device array (the tokens the running
        cycle settles, at most `most`), so the slice is taken on the device."""
        if n == 0:
            return mx.zeros((0, 2))
        end = start + most + n
        while end > len(self._blocks) * self.block:
            self._key, sub = mx.random.split(self._key)
            self._blocks.append(mx.random.uniform(shape=(self.block, 2), key=sub))
        first, last = start // self.block, (end - 1) // self.block
        joined = mx.concatenate(self._blocks[first : last + 1]) if last > first else self._blocks[first]
        offset = start - first * self.block
        if ahead is None:
            return joined[offset : offset + n]
        return mx.slice(joined, (ahead + offset).reshape(1), axes=(0,), slice_size=(n, 2))


STREAMS = ("target", "accept", "residual", "draft")


def uniform_streams(seed: Optional[int]) -> dict:
    """Independent uniform streams, one per use, from one seed (a fresh random one if None)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    keys = mx.random.split(mx.random.key(seed), len(STREAMS))
    return {name: UniformStream(keys[i]) for i, name in enumerate(STREAMS)}
