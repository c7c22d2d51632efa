"""The OpenAI wire format: request models, the error body, and request -> `SamplingParams`.

Owns what a client may send to `/v1/chat/completions` and `/v1/completions` (OpenAI's fields,
plus vLLM's sampling extensions `top_k`, `min_p`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `skip_special_tokens`, `include_stop_str_in_output`), `APIError` (status +
OpenAI's `{"error": {"message", "type", "param", "code"}}`), and the mapping to the engine's
`SamplingParams`. Does not own rendering prompts (`chat`), logprobs shapes (`logprobs`) or routes.

Fields the engine cannot honour (presence/frequency/repetition penalties, logit_bias, a
non-text response_format, suffix) are accepted at their neutral value and refused with a 400
naming the field otherwise: silently ignoring a sampling control changes what users get.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longhaul.inference.sampling import SamplingParams, SamplingParamsError


class APIError(Exception):
    """An HTTP error with OpenAI's body; `headers` go on the response (Retry-After, x-ratelimit-*)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


_UNION_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.*\]|function-.*)$")


def validate(model: type[BaseModel], data: dict):
    """`model` from a JSON object, or a 400 naming the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if not _UNION_TAG.match(str(p)))  # drop pydantic's union member names
        raise bad_request(f"{where}: {err['msg']}" if where else err["msg"], where or None) from None


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # clients send fields we do not read


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Open):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool = False


class SamplingFields(_Open):
    """Fields both endpoints share."""

    model: str | None = None
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    repetition_penalty: float | None = None

    def check_supported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise bad_request(f"{name} is not supported by this server; leave it at 0", name)
        if self.repetition_penalty not in (None, 1.0):
            raise bad_request("repetition_penalty is not supported by this server; leave it at 1", "repetition_penalty")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server; leave it empty", "logit_bias")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise bad_request("stop takes at most 16 strings", "stop")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise bad_request("response_format other than text is not supported by this server", "response_format")
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")

    @property
    def num_top_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def check_supported(self) -> None:
        super().check_supported()
        if self.suffix:
            raise bad_request("suffix is not supported by this server", "suffix")
        if self.best_of not in (None, self.n):
            raise bad_request("best_of must equal n on this server", "best_of")
        if self.echo and self.logprobs is not None:
            raise bad_request("echo with logprobs (prompt logprobs) is not supported by this server", "echo")

    @property
    def num_top_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def sampling_params(req: SamplingFields, max_tokens: int, index: int) -> SamplingParams:
    """The engine's params for choice `index` of a request (a seeded request gives choice i seed + i)."""
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0, min_p=req.min_p or 0.0,
            max_tokens=max_tokens, min_tokens=req.min_tokens, stop=req.stop,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, skip_special_tokens=req.skip_special_tokens,
            seed=None if req.seed is None else (req.seed + index) % 2**63, logprobs=req.num_top_logprobs)
    except SamplingParamsError as e:
        raise bad_request(str(e).removeprefix("SamplingParams.")) from None
