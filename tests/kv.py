"""Tests' view of a target's caches: fresh caches, a prefill in the loop's chunks, and the
K/V a drafter reads, sliced to exactly the positions it attends (oldest first) to compare with
transformers, or handed to a draft step in the masked form the loop uses."""

from typing import Dict, Tuple

import mlx.core as mx

from mlx_spec.decoding.limits import PREFILL_CHUNK, TRIM_ALLOWANCE
from mlx_spec.models.protocol import SharedKV


def fresh_cache(target) -> list:
    return target.make_cache(TRIM_ALLOWANCE)


def prefill(target, tokens: mx.array, cache: list, chunk: int = PREFILL_CHUNK, spans=(), start: int = 0) -> mx.array:
    return target.prefill(tokens, cache, chunk, spans, start)


def sliced(kv: Dict[str, SharedKV]) -> Dict[str, Tuple[mx.array, mx.array]]:
    """(keys, values) of each range, oldest first: slots lo .. hi, or for a batch's row (the
    positions each slot holds given) the slots holding positions lo .. hi, in their order."""
    out = {}
    for kind, v in kv.items():
        if v.held is None:
            out[kind] = (v.keys[..., v.lo : v.hi, :], v.values[..., v.lo : v.hi, :])
            continue
        held, lo, hi = v.held[0].tolist(), v.lo.item(), v.hi.item()
        slots = mx.array(sorted((p, s) for s, p in enumerate(held) if lo <= p < hi))[:, 1]
        out[kind] = (v.keys[..., slots, :], v.values[..., slots, :])
    return out


def exact_kv(target, cache: list) -> Dict[str, Tuple[mx.array, mx.array]]:
    """What the drafter reads of `cache` (`Target.drafter_buffers`), sliced."""
    return sliced(target.drafter_buffers(cache))


def step_kv(assistant, kv: Dict[str, Tuple[mx.array, mx.array]]) -> tuple:
    """A draft step's K/V inputs from exactly the positions to read, as whole buffers."""
    return assistant.kv_inputs({kind: SharedKV(k, v, 0, k.shape[-2]) for kind, (k, v) in kv.items()})
