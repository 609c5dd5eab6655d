"""Request models of OpenAI's chat completions and completions (the Responses and Messages
requests become chat requests: responses_api.py, messages_api.py), and the error object every
failure returns.

Fields OpenAI defines are checked for their types (a wrong type is a 400 naming the field);
fields we do not know are ignored, as OpenAI's own clients send many optional ones. What we
cannot honour with exact decoding (n > 1, penalties, logit bias, echo) is refused by name
rather than silently dropped. JSON modes and a forced tool choice hold the answer to their
grammar (formats.py).
"""

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from ..media.images import SOFT_TOKEN_BUDGETS
from ..options import Options
from ..message_checks import checked_tool
from .chat_checks import checked_message
from .formats import chat_json_schema, chat_tool_choice

MAX_TOP_LOGPROBS = 5  # the per-token report keeps the top 5
# Each token is matched against every stop string on the model's thread, the batch's other rows
# waiting: bounded, as OpenAI bounds them (to 4).
MAX_STOPS, MAX_STOP_CHARS = 16, 1000


class APIError(Exception):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class Described:
    """A request model whose route reads its body itself (to answer every malformed one with
    the dialect's error object), described in /openapi.json."""

    @classmethod
    def openapi_body(cls, models: Optional[List[str]]) -> Dict[str, Any]:
        """The route's request body for the API description. `model` lists the names served
        (any other is a 404), unless the server takes any name (None)."""
        schema = cls.model_json_schema()
        named = {"enum": list(models)} if models is not None else {"type": "string"}
        schema["properties"]["model"] = {"anyOf": [named, {"type": "null"}], "default": None}
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class _Request(Described, BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: Optional[StrictFloat] = Field(None, ge=0)
    top_p: Optional[StrictFloat] = Field(None, gt=0, le=1)
    top_k: Optional[StrictInt] = Field(None, ge=0)  # extension, as llama.cpp and vLLM
    seed: Optional[StrictInt] = Field(None, ge=0, lt=2**64)
    stop: Optional[Union[str, List[str]]] = None
    stream: StrictBool = False
    stream_options: Optional[Dict[str, Any]] = None
    n: Optional[StrictInt] = 1
    presence_penalty: Optional[StrictFloat] = 0.0
    frequency_penalty: Optional[StrictFloat] = 0.0
    logit_bias: Optional[Dict[str, StrictFloat]] = None
    mtp: Optional[StrictBool] = None  # extension: False decodes with the target alone, True needs a drafter
    x_report: StrictBool = False  # extension: our per-token reports as `x_tokens`

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters each")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value):
        # (a dict, not a model: a nested model would put a $ref in the API description)
        usage = (value or {}).get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise ValueError("include_usage must be true or false")
        return value

    @model_validator(mode="after")
    def _supported(self):
        if self.n not in (None, 1):
            raise ValueError("n must be 1: one answer per request")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (decoding stays exact)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported (decoding stays exact)")
        return self

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def options(self, defaults: Options) -> Options:
        """The request as Options: its settings where it gives them, the server's (`defaults`)
        elsewhere. With no max_tokens, the server's default is cut to what the context leaves."""
        given = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed, mtp=self.mtp)
        given = {name: value for name, value in given.items() if value is not None}
        if self.limit is None:
            given.update(max_tokens=defaults.max_tokens, fit_context=True)
        else:
            given.update(max_tokens=self.limit, fit_context=False)
        return defaults.but(stop=tuple(self.stop or ()), report=self.wants_report, **given, **self.own_options(defaults))

    def own_options(self, defaults: Options) -> Dict[str, Any]:
        return {}


class ChatRequest(_Request):
    messages: List[Dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    logprobs: Optional[StrictBool] = False
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: Optional[Dict[str, Any]] = None
    thinking: Optional[StrictBool] = None  # extension; or chat_template_kwargs.enable_thinking
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    image_tokens: Optional[StrictInt] = None  # extension: soft tokens per image (70, 140, 280, 560, 1120)

    @field_validator("image_tokens")
    @classmethod
    def _image_tokens(cls, value):
        if value is not None and value not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"image_tokens must be one of {', '.join(map(str, SOFT_TOKEN_BUDGETS))}")
        return value

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages):
        return [checked_message(m, i) for i, m in enumerate(messages)]

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools):
        return None if tools is None else [checked_tool(t, i) for i, t in enumerate(tools)]

    @model_validator(mode="after")
    def _chat_supported(self):
        chat_json_schema(self.response_format)  # (its errors named here, as a 400)
        choice = chat_tool_choice(self.tool_choice)
        if choice not in (None, "none") and not self.tools:
            raise ValueError(f"tool_choice {self.tool_choice!r} needs tools")
        names = [t["function"]["name"] for t in self.tools or []]
        if choice not in (None, "none", "required") and choice not in names:
            raise ValueError(f"tool_choice names {choice!r}, which is not among the tools")
        return self

    @property
    def forced_tool(self) -> Any:
        """Options' tool_choice: "required", a tool's name, or None."""
        choice = chat_tool_choice(self.tool_choice)
        return choice if choice != "none" else None

    @property
    def json_schema(self) -> Any:
        """What `response_format` holds the answer to (Options.json_schema), or None."""
        return chat_json_schema(self.response_format)

    @property
    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    @property
    def enable_thinking(self) -> Optional[bool]:
        if self.thinking is not None:
            return self.thinking
        value = (self.chat_template_kwargs or {}).get("enable_thinking")
        return value if isinstance(value, bool) else None

    @property
    def wants_report(self) -> bool:
        return bool(self.logprobs or self.x_report)

    def own_options(self, defaults: Options) -> Dict[str, Any]:
        thinking = defaults.thinking if self.enable_thinking is None else self.enable_thinking
        own = {"thinking": thinking, "json_schema": self.json_schema, "tool_choice": self.forced_tool}
        return own if self.image_tokens is None else {**own, "image_tokens": self.image_tokens}

    @property
    def active_tools(self) -> Optional[List[Dict[str, Any]]]:
        return None if self.tool_choice == "none" else self.tools or None


class CompletionRequest(_Request):
    prompt: Union[str, List[StrictInt], List[str]]
    logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: StrictBool = False
    suffix: Optional[str] = None
    best_of: Optional[StrictInt] = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise ValueError("one prompt per request")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @model_validator(mode="after")
    def _completion_supported(self):
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of must be 1: one answer per request, generated and returned")
        return self

    @property
    def limit(self) -> Optional[int]:
        return self.max_tokens

    @property
    def wants_report(self) -> bool:
        return self.logprobs is not None or self.x_report
