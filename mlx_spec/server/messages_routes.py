"""Anthropic's routes, `POST /v1/messages` and `POST /v1/messages/count_tokens` (messages_api.py
translates the request, messages_events.py the answer). Their errors come in Anthropic's
envelope (app.py picks it by the path)."""

from fastapi import FastAPI, Request

from .body import described, parse
from .gate import Gate
from .generation import generation
from .messages_api import CountTokens, CreateMessage
from .messages_events import MessagesFormat
from .responses_routes import ceiling, ignored_header, translated
from .streaming import answer

MESSAGES = "/v1/messages"


def add_messages_routes(app: FastAPI, gate: Gate) -> None:
    accepted = gate.names.in_schema

    @app.post(MESSAGES, openapi_extra=CreateMessage.openapi_body(accepted),
              responses=described(200, 400, 401, 404, 413, 503, streams=True, anthropic=True))
    async def messages(request: Request):
        gate.check_key(request)
        req = await parse(request, CreateMessage)
        gate.check_model(req.model)
        chat = translated(req)
        options = ceiling(chat.options(gate.defaults))
        tokens = await gate.chat_prompt(chat, options)
        form = MessagesFormat(gate.names.id, req.x_report, len(tokens.tokens))
        response = await answer(request, gate.worker.submit(generation(tokens, options, chat.active_tools)), form,
                                req.stream)
        ignored_header(response, req.function_tools()[1])
        return response

    @app.post(MESSAGES + "/count_tokens", openapi_extra=CountTokens.openapi_body(accepted),
              responses=described(200, 400, 401, 404, 413, anthropic=True))
    async def count_tokens(request: Request):
        gate.check_key(request)
        req = await parse(request, CountTokens)
        gate.check_model(req.model)
        chat = translated(req)
        options = chat.options(gate.defaults)
        prepared = await gate.chat_prompt(chat, options)
        return {"input_tokens": len(prepared.tokens)}
