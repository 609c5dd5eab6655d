"""Media in chat messages: the content parts that carry them, and their soft tokens in the prompt.

Parts a message's content may hold besides text:
- `{"type": "image", "image": path | PIL image | bytes | uint8 array}` ("url" or "path" also);
- `{"type": "image_url", "image_url": {"url": data URL, file:// URL or path}}` (OpenAI's shape);
- `{"type": "audio", "audio": path | WAV bytes | (samples, rate) | 16 kHz samples}`;
- `{"type": "input_audio", "input_audio": {"data": base64 WAV, "format": "wav"}}` (OpenAI's).

Google's template writes one `<|image|>` or `<|audio|>` token for each. As Gemma 4's processor,
`expand` replaces it by the begin marker, the item's soft tokens and the end marker.
"""

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import MediaError
from .items import AUDIO, IMAGE, MediaItem, MediaSpan

Message = Dict[str, Any]
_IMAGE_TYPES = ("image", "image_url", "input_image")
_AUDIO_TYPES = ("audio", "input_audio")


@dataclass(frozen=True)
class MediaTokens:
    """The token ids around and inside media, from a checkpoint's config."""

    image: int
    boi: int
    eoi: int
    audio: int
    boa: int
    eoa: int

    @staticmethod
    def from_config(config: dict) -> "MediaTokens":
        get = config.get
        return MediaTokens(get("image_token_id", 258_880), get("boi_token_id", 255_999), get("eoi_token_id", 258_882),
                           get("audio_token_id", 258_881), get("boa_token_id", 256_000),
                           get("eoa_token_id", get("eoa_token_index", 258_883)))


@dataclass(frozen=True)
class MediaSource:
    kind: str  # IMAGE or AUDIO
    value: Any  # what the part gave: a path, bytes, an array, a PIL image, (samples, rate)
    where: str  # "messages[i].content[j]", for errors


def has_media(messages: Sequence[Message]) -> bool:
    return any(_kind(part) for m in messages for part in _parts(m))


def split_media(messages: Sequence[Message], allow_files: bool = True) -> Tuple[List[Message], List[MediaSource]]:
    """The messages as the template reads them (each media part reduced to its type) and the
    media in the order the template writes them."""
    out, sources = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            kind = _kind(part)
            if kind is None:
                parts.append(part)
                continue
            where = part_place(part, i, j)
            sources.append(MediaSource(kind, _value(part, kind, where, allow_files), where))
            parts.append({"type": kind})
        out.append({**message, "content": parts})
    return out, sources


def expand(tokens: Sequence[int], items: Sequence[MediaItem], ids: MediaTokens,
           embed: Callable[[MediaItem], Any]) -> Tuple[List[int], List[MediaSpan]]:
    """`tokens` with each media token replaced by its item's markers and soft tokens, and the
    spans of those soft tokens. `embed(item)` gives the item's embeddings when prefill needs them."""
    placeholders = [t for t in tokens if t in (ids.image, ids.audio)]
    kinds = [IMAGE if t == ids.image else AUDIO for t in placeholders]
    if kinds != [item.kind for item in items]:
        raise MediaError(f"the prompt's media tokens ({', '.join(kinds) or 'none'}) do not match its media parts "
                         f"({', '.join(item.kind for item in items) or 'none'}): is a media token written in the text?")
    out: List[int] = []
    spans: List[MediaSpan] = []
    queue = iter(items)
    for t in tokens:
        if t not in (ids.image, ids.audio):
            out.append(t)
            continue
        item = next(queue)
        begin, end = (ids.boi, ids.eoi) if item.kind == IMAGE else (ids.boa, ids.eoa)
        out.append(begin)
        spans.append(MediaSpan(len(out), item, lambda item=item: embed(item)))
        out.extend([t] * item.tokens)
        out.append(end)
    return out, spans


def _parts(message: Message) -> list:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _kind(part: Any) -> Optional[str]:
    kind = part.get("type") if isinstance(part, dict) else None
    return IMAGE if kind in _IMAGE_TYPES else AUDIO if kind in _AUDIO_TYPES else None


# WAV always; the others through soundfile where it is installed (the content decides, not the name).
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")


# A media part translated from another dialect (Anthropic's Messages, OpenAI's Responses) names
# where the client put it, so that its errors point there rather than at the chat message made of it.
PLACE = "x_place"


# A media part a tool returned (Codex's view_image, Claude Code's Read of an image), marked so by
# the dialect that translated it. The agent sent it without choosing to: on a model that does not
# take its kind it becomes a note (`returned_media_as_notes`), where a refusal would refuse every
# later turn of the session, as each sends it again.
RETURNED = "x_returned"


def returned_media_as_notes(messages: Sequence[Message], takes: Callable[[str], bool]) -> List[Message]:
    """The messages with each media part a tool returned, of a kind this model does not take
    (`takes(kind)` False), as a text note in its place."""
    def noted(part: Any) -> Any:
        kind = _kind(part)
        if kind is None or not part.get(RETURNED) or takes(kind):
            return part
        return {"type": "text", "text": f"[a tool returned {_KIND_NAMES[kind]} here; this model takes no {kind} input]"}

    return [{**m, "content": [noted(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in messages]


_KIND_NAMES = {IMAGE: "an image", AUDIO: "an audio clip"}


def part_place(part: Any, i: int, j: int) -> str:
    """Where a content part is, for errors: the client's own place, else messages[i].content[j]."""
    place = part.get(PLACE) if isinstance(part, dict) else None
    return place if isinstance(place, str) else f"messages[{i}].content[{j}]"


def media_pointer(part: Any) -> Optional[Tuple[str, Any]]:
    """(kind, what the part points at) for a media part, None for any other: a URL or path
    string, or the value itself (bytes, an array, a PIL image, samples), or for `input_audio`
    its {data, format} body. The one reader of where each part shape keeps its media: the
    server screens the same pointers (which URLs it may fetch, which files it may read)."""
    kind = _kind(part)
    if kind is None:
        return None
    shape = part["type"]
    if shape == "input_audio":
        return kind, part.get("input_audio")
    if shape in ("image_url", "input_image"):
        url = part.get(shape)
        return kind, url.get("url") if isinstance(url, dict) else url
    return kind, next((part[key] for key in (kind, "url", "path") if part.get(key) is not None), None)


def _value(part: dict, kind: str, where: str, allow_files: bool) -> Any:
    """What a media part holds, decoded from a URL or base64 where it is given so."""
    shape, (_, pointer) = part["type"], media_pointer(part)
    if shape == "input_audio":
        if not isinstance(pointer, dict) or not isinstance(pointer.get("data"), str):
            raise MediaError(f"{where}: input_audio must be {{'data': base64 audio, 'format': 'wav'}}")
        if pointer.get("format", "wav") not in AUDIO_FORMATS:
            raise MediaError(f"{where}: audio format {pointer.get('format')!r} is not supported; send one of "
                             f"{', '.join(AUDIO_FORMATS)}")
        return _base64(pointer["data"], where)
    if shape in ("image_url", "input_image") and not isinstance(pointer, str):
        raise MediaError(f"{where}: {shape} must be {{'url': a data URL or a file}}")
    if pointer is None:
        raise MediaError(f"{where}: a {kind} part needs its content under {kind!r}")
    return _from_url(pointer, where, allow_files) if isinstance(pointer, str) else pointer


def _from_url(url: str, where: str, allow_files: bool) -> Any:
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        if not header.endswith(";base64"):
            raise MediaError(f"{where}: a data URL must be base64 (data:<type>;base64,...)")
        return _base64(data, where)
    if url.startswith(("http://", "https://")):
        raise MediaError(f"{where}: remote URLs are not fetched; download the file and send it as a data URL")
    path = url[len("file://"):] if url.startswith("file://") else url
    if not allow_files:
        raise MediaError(f"{where}: local files are not read here; send the content as a data URL")
    return path


def _base64(data: str, where: str) -> bytes:
    # Line breaks (MIME's base64, wrapped at 76) and the URL-safe alphabet are base64 too.
    data = "".join(data.split())
    try:
        return base64.b64decode(data, altchars=b"-_" if "-" in data or "_" in data else None, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{where}: the data is not valid base64") from None
