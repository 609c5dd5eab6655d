"""What every route checks before a request reaches the model: its API key, the model it names,
where its media may point, and its prompt rendered, tokenized and fitted to the context (on a
thread of its own, so that a long prompt holds up no other request)."""

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any, List, Optional

from fastapi import Request
from jinja2 import TemplateError

from ..errors import SettingsError
from ..options import Options
from .generation import prompt_tokens
from .media import screen_media
from .names import ModelNames
from .schemas import APIError


@dataclass
class Gate:
    worker: Any  # worker.Worker
    names: ModelNames
    defaults: Options  # the server's settings for what a request leaves out
    api_key: Optional[str] = None
    allow_files: bool = False
    allow_fetch: bool = False
    max_body_bytes: int = 16 * 1024 * 1024

    def check_key(self, request: Request) -> None:
        """`Authorization: Bearer KEY` (OpenAI's clients, and Anthropic's given a token) or
        `x-api-key: KEY` (Anthropic's), when the server has a key."""
        if self.api_key is None:
            return
        bearer = request.headers.get("authorization", "")
        key = request.headers.get("x-api-key", "")
        if not (secrets.compare_digest(bearer.encode(), f"Bearer {self.api_key}".encode())
                or secrets.compare_digest(key.encode(), self.api_key.encode())):
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def check_model(self, name: Optional[str]) -> None:
        names = self.names
        if name is not None and name not in names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{names.id}` "
                           f"(also called {', '.join(f'`{n}`' for n in names.aliases) or 'nothing else'}).",
                           param="model", code="model_not_found")

    async def screened(self, messages: List[dict]) -> List[dict]:
        """The messages with their remote media fetched where the server allows it."""
        return await asyncio.to_thread(screen_media, messages, self.allow_files, self.allow_fetch, self.max_body_bytes)

    async def chat_prompt(self, chat, options: Options):
        """A chat request's prompt (every dialect's request becomes one): its media screened,
        then its tokens (see `tokens_of`)."""
        return await self.tokens_of(await self.screened(chat.messages), options, chat.active_tools)

    async def tokens_of(self, prompt, options: Options, tools=None):
        """The prompt's tokens, on a thread of its own (see `prompt_tokens`)."""
        try:
            return await asyncio.to_thread(prompt_tokens, self.worker.engine, prompt, options, tools)
        except (SettingsError, TemplateError) as e:  # messages the rules or the template refuse
            raise APIError(400, str(e), code="invalid_value") from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            # The template ran on what the client sent, and failed on it: the request's fault.
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages",
                           code="invalid_value") from None
