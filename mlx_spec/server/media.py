"""What a request's images and audio may point at, decided before the model sees them.

Content parts carry media as data URLs or base64 (always accepted), as local file paths (only
when the server was started with `--allow-files`: otherwise any client could read the
server's files), or as http(s) URLs (only with `--allow-fetch`: a server that fetches any URL
is a door into the network it runs in). Fetched media become bytes in the part; decoding and
every later check is the engine's (`Engine.prepare`), whose errors are 400s.
"""

import http.client
import urllib.error
import urllib.request
from typing import Any, Dict, List

from ..media.prompt import PLACE, media_pointer, part_place
from .schemas import APIError

FETCH_TIMEOUT = 10.0  # seconds


def screen_media(messages: List[Dict[str, Any]], allow_files: bool, allow_fetch: bool, max_bytes: int) -> List[dict]:
    """The messages with remote media fetched (where allowed); a part pointing where the
    server may not go is a 400 naming it and the flag that allows it."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": [_screened(p, part_place(p, i, j), allow_files, allow_fetch,
                                                        max_bytes) for j, p in enumerate(content)]}
        out.append(message)
    return out


def _screened(part: dict, where: str, allow_files: bool, allow_fetch: bool, max_bytes: int) -> dict:
    pointer = media_pointer(part)
    if pointer is None:
        return part
    kind, url = pointer
    if not isinstance(url, str) or url.startswith("data:"):
        return part  # the engine checks its shape and decodes it
    if url.startswith(("http://", "https://")):
        if not allow_fetch:
            raise APIError(400, f"{where}: this server fetches no URLs (start it with --allow-fetch); send the "
                                "content as a data URL", param=where, code="invalid_value")
        return {"type": kind, kind: fetch(url, where, max_bytes), PLACE: where}
    if not allow_files:
        raise APIError(400, f"{where}: this server reads no local files (start it with --allow-files); send the "
                            "content as a data URL", param=where, code="invalid_value")
    return part


def fetch(url: str, where: str, max_bytes: int) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
            body = response.read(max_bytes + 1)
    # (http.client's own errors, a reply that is not HTTP such as an SSH banner, come through
    # urllib unwrapped)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        raise APIError(400, f"{where}: could not fetch {url} ({e})", param=where, code="invalid_value") from None
    if len(body) > max_bytes:
        raise APIError(413, f"{where}: {url} is over {max_bytes} bytes", param=where, code="request_too_large")
    return body
