"""The media side of an engine: the checkpoint's media encoder, made when the first image or
audio clip arrives, and the prompt that puts its items' soft tokens among the text's.

A text prompt never pays for the encoder. It is made under a lock: the server prepares prompts
on a pool of threads, and two first images at once must not build two encoders.
"""

import threading
from pathlib import Path
from typing import Any, Callable, List, Optional

from ..errors import MediaError
from .items import IMAGE, Prepared
from .loading import check_kind
from .prompt import expand, has_media, returned_media_as_notes, split_media


class MediaSide:
    def __init__(self, path: Optional[Path], config: dict, load_encoder: Optional[Callable[[Path, dict], Any]]):
        """load_encoder: the family's (models/registry.py: `Family.load_media`); None for a
        family without media input."""
        self.path, self.config, self._load_encoder = path, config, load_encoder
        self._encoder = None
        self._lock = threading.Lock()

    def encoder(self):
        """The checkpoint's media encoder (its weights are read with the first item embedded)."""
        with self._lock:
            if self._encoder is None:
                if self._load_encoder is None or self.path is None:
                    where = self.path or "this model (made in memory, with no checkpoint)"
                    raise MediaError(f"{where}: this model takes no image or audio input")
                self._encoder = self._load_encoder(self.path, self.config)
            return self._encoder

    def takes(self, kind: str) -> bool:
        """Whether this model reads media of this kind (its encoder is made, its weights not read)."""
        try:
            return bool(self.encoder().can.get(kind))
        except MediaError:  # a text-only checkpoint, or a model made in memory
            return False

    def load(self) -> None:
        """Make the encoder and read its weights now (to fail at start, not at the first image)."""
        self.encoder().load()

    def prepare(self, messages: List[dict], chat_tokens: Callable[[List[dict]], List[int]],
                image_tokens: Optional[int] = None, allow_files: bool = True) -> Prepared:
        """Token ids and media of chat messages with media parts: each part becomes its begin
        marker, soft tokens and end marker, and a span that puts the encoder's embeddings there
        at prefill. `chat_tokens`: the messages (parts reduced to their type) through the chat
        template. `allow_files`: whether a part may name a local file."""
        messages = returned_media_as_notes(messages, self.takes)
        if not has_media(messages):
            return Prepared(chat_tokens(messages), [])
        messages, sources = split_media(messages, allow_files)
        try:
            encoder = self.encoder()
        except MediaError as e:  # named where the first media part is: the request's own place
            raise MediaError(f"{sources[0].where}: {e}") from None
        items = []
        for source in sources:
            check_kind(encoder, source.kind, self.path)
            try:
                items.append(encoder.image(source.value, image_tokens) if source.kind == IMAGE
                             else encoder.audio(source.value))
            except MediaError as e:
                raise MediaError(f"{source.where}: {e}") from None
        return Prepared(*expand(chat_tokens(messages), items, encoder.tokens, encoder.embed))
