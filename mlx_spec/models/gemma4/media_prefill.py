"""A prompt chunk with media through the target, as transformers' Gemma 4 runs it.

- The soft tokens' inputs are the media encoder's embeddings, put where the tokens are. mlx-lm's
  text model multiplies its input embeddings by `embed_scale`; transformers multiplies the text
  tokens' embeddings only, so the media embeddings go in divided by it.
- Per-layer inputs (E2B, E4B): a soft token's token-identity part is the pad token's, as
  transformers looks it up; the projected part comes from the media embedding itself.
- Where the config asks for it (`use_bidirectional_attention: "vision"`), an image's soft tokens
  see each other both ways on the sliding-window layers (full layers stay causal, audio stays
  causal), as transformers' `create_masks_for_vision_model` builds it. An image therefore goes
  through in one chunk (`media.items.chunk_bounds`); an audio clip may be cut between chunks,
  each chunk's span its piece of the clip (`MediaSpan.piece`).
"""

from typing import Optional, Sequence

import mlx.core as mx

from ...media.items import IMAGE, MediaSpan
from ..cache import SlidingWindowCache


def hidden_with_media(target, tokens: mx.array, cache: list, spans: Sequence[MediaSpan], start: int) -> mx.array:
    """The target's hidden states [1, L, H] of `tokens` (absolute positions from `start`) with
    the spans' embeddings at their soft tokens; appended to `cache`."""
    model = target.text_model
    ids, pieces, at = tokens, [], 0
    pad = mx.array([target.args.pad_token_id], tokens.dtype)
    embedded = model.embed_tokens(tokens)
    for span in sorted(spans, key=lambda s: s.start):
        lo, hi = span.start - start, span.end - start
        features = span.embed()
        if features.shape != (span.item.tokens, embedded.shape[-1]):
            raise ValueError(f"the {span.item.kind} encoder gave {tuple(features.shape)} for "
                             f"{span.item.tokens} soft tokens of width {embedded.shape[-1]}")
        pieces += [embedded[:, at:lo], (features / model.embed_scale).astype(embedded.dtype)[None]]
        ids = mx.concatenate([ids[:, :lo], mx.repeat(pad[None], hi - lo, axis=1), ids[:, hi:]], axis=1)
        at = hi
    pieces.append(embedded[:, at:])
    blocks = _image_blocks(tokens.shape[1], spans, start) if target.images_attend_both_ways else None
    if blocks is not None:
        cache = [BothWaysInBlocks(c, blocks) if isinstance(c, SlidingWindowCache) else c for c in cache]
    return model(ids, cache=cache, input_embeddings=mx.concatenate(pieces, axis=1))


def _image_blocks(length: int, spans: Sequence[MediaSpan], start: int) -> Optional[mx.array]:
    """For each new position, the index of the image it belongs to, or -1."""
    images = [s for s in spans if s.item.kind == IMAGE]
    if not images:
        return None
    blocks = [-1] * length
    for n, span in enumerate(images):
        blocks[span.start - start: span.end - start] = [n] * span.item.tokens
    return mx.array(blocks)


class BothWaysInBlocks:
    """A sliding-window cache whose mask for the new positions also lets an image's soft tokens
    see the later ones of the same image (still within the window's lower bound)."""

    def __init__(self, cache: SlidingWindowCache, blocks: mx.array):
        self._cache, self._blocks = cache, blocks

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def update_and_fetch(self, keys, values):
        return self._cache.update_and_fetch(keys, values)

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        causal = self._cache.make_mask(N, window_size=window_size, return_array=True)  # [N, K], keys end with the new
        offset, window = self._cache.offset, self._cache.window
        keys = causal.shape[1]
        key_blocks = mx.concatenate([mx.full((keys - N,), -1, self._blocks.dtype), self._blocks])
        same = (self._blocks[:, None] == key_blocks[None]) & (self._blocks[:, None] >= 0)
        q = offset + mx.arange(N)[:, None]
        k = offset + N - keys + mx.arange(keys)[None]
        return (causal | same) & (k > q - window)
