"""OpenAI's routes: chat completions, completions and the models."""

from fastapi import FastAPI, Request

from .body import described, parse
from .gate import Gate
from .generation import generation
from .chat_objects import ChatFormat, CompletionFormat
from .schemas import ChatRequest, CompletionRequest
from .streaming import answer


def add_openai_routes(app: FastAPI, gate: Gate) -> None:
    names, worker = gate.names, gate.worker

    @app.get("/v1/models", responses=described(200, 401))
    async def models(request: Request):
        gate.check_key(request)
        return {"object": "list", "data": [names.card(n) for n in names.listed]}

    @app.get("/v1/models/{name:path}", responses=described(200, 401, 404))
    async def model(name: str, request: Request):
        gate.check_key(request)
        if not name:  # `/v1/models/`: the list, as a client joining a base URL with a slash asks
            return await models(request)
        gate.check_model(name)
        return names.card(name)

    @app.post("/v1/chat/completions", openapi_extra=ChatRequest.openapi_body(names.in_schema),
              responses=described(200, 400, 401, 404, 413, 503, streams=True))
    async def chat_completions(request: Request):
        gate.check_key(request)
        req = await parse(request, ChatRequest)
        gate.check_model(req.model)
        options = req.options(gate.defaults)
        tokens = await gate.chat_prompt(req, options)
        form = ChatFormat(names.id, bool(req.logprobs), req.top_logprobs or 0, req.x_report)
        return await answer(request, worker.submit(generation(tokens, options, req.active_tools)), form, req.stream,
                            req.include_usage)

    @app.post("/v1/completions", openapi_extra=CompletionRequest.openapi_body(names.in_schema),
              responses=described(200, 400, 401, 404, 413, 503, streams=True))
    async def completions(request: Request):
        gate.check_key(request)
        req = await parse(request, CompletionRequest)
        gate.check_model(req.model)
        options = req.options(gate.defaults)
        tokens = await gate.tokens_of(req.prompt, options)
        form = CompletionFormat(names.id, req.logprobs, req.x_report)
        return await answer(request, worker.submit(generation(tokens, options, as_written=True)), form,
                            req.stream, req.include_usage)
