"""OpenAI request and response models (the subset fleetllm serves), and OpenAI-shaped errors.

Requests parse every field; the ones fleetllm does not read itself go, with the sampling fields, through
the one field table (fleetllm.engines.fields): honoured by the engine, or a 400 naming the field. Responses
are built from these models and dumped without unset optionals.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetllm.engines.openai_api.logprobs import chat_logprobs, completion_logprobs  # noqa: F401 - the API's shapes
from fleetllm.errors import validation_problems


class APIError(Exception):
    """An error that becomes an OpenAI-shaped JSON response with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def overloaded(message: str, status: int = 429, retry_after_s: float = 1.0) -> APIError:
    return APIError(status, message, type="rate_limit_error" if status == 429 else "service_unavailable",
                    code="overloaded", headers={"Retry-After": str(max(1, int(round(retry_after_s))))})


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) on every chunk, with include_usage


class _RequestBase(BaseModel):
    """The fields both endpoints share; each request names its own token limit and logprobs."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=16)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)  # a 64-bit integer, as vLLM bounds it
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    user: str | None = None
    # structured outputs (fleetllm.structured): OpenAI's response_format or vLLM's structured_outputs
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    # request fields copied unchanged into the engine's sampling dict
    SAMPLING_FIELDS: ClassVar[tuple[str, ...]] = ("n", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos",
                                                  "min_tokens", "repetition_penalty", "response_format",
                                                  "structured_outputs")

    @field_validator("response_format", "structured_outputs")
    @classmethod
    def _constraint_parses(cls, value: dict[str, Any] | None, info) -> dict[str, Any] | None:
        from fleetllm.errors import RowError
        from fleetllm import structured

        if value is None:
            return None
        try:  # a malformed constraint is a 400 naming it, before the request reaches an engine
            getattr(structured, f"from_{info.field_name}")(value)
        except RowError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_constraint(self) -> "_RequestBase":
        from fleetllm.errors import RowError
        from fleetllm.structured import pop_constraint

        try:
            pop_constraint({"response_format": self.response_format, "structured_outputs": self.structured_outputs})
        except RowError as exc:
            raise ValueError(str(exc)) from None
        return self

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):  # as OpenAI and vLLM refuse it
            raise ValueError("`stream_options` is only allowed when `stream` is true; set stream: true or remove it")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("`stop` takes up to 4 non-empty strings")
        return stops

    def output_limit(self) -> int | None:
        """The requested output token limit."""
        return self.max_tokens

    def logprobs_count(self) -> int | None:
        """Top logprobs per token (0: the chosen token's only), None for no logprobs."""
        return None

    def engine_sampling(self) -> dict[str, Any]:
        """The engine's sampling dict (unset values left out): the sampling fields and every field this
        model does not declare, checked against the field table (types, ranges; the engine refuses what it
        does not honour). Raises APIError 400 naming the field."""
        from fleetllm.engines.fields import FieldError, check_sampling

        params = {k: getattr(self, k) for k in self.SAMPLING_FIELDS}
        params.update(max_tokens=self.output_limit(), logprobs=self.logprobs_count())
        params.update(self.model_extra or {})
        try:
            return check_sampling(params, None)
        except FieldError as exc:
            raise APIError(400, str(exc), param=exc.param) from None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str  # OpenAI's roles, or a custom one passed to the chat template as it is (as vLLM does)
    content: str | list[dict[str, Any]] | None = None

    def require_content(self, where: str) -> None:
        """A message without content (missing or null) is a 400, as OpenAI answers; only an assistant
        message carrying tool_calls (or function_call) may leave it out."""
        if self.content is not None:
            return
        if self.role == "assistant" and any((self.model_extra or {}).get(k) for k in ("tool_calls", "function_call")):
            return
        raise APIError(400, f"Missing required parameter: '{where}'; give the {self.role} message a `content` "
                       "(a string or a list of content parts)", param=where, code="missing_required_parameter")

    def plain(self, index: int = 0, images: bool = False) -> dict[str, Any]:
        """{role, content} with text content ([{type: text, text}] parts joined); a non-text part (the
        served models read text only) or a part whose text is not a string is a 400 naming it."""
        from fleetllm.engines.chat import text_content
        from fleetllm.errors import RowError

        where = f"messages[{index}].content"
        self.require_content(where)
        if images and isinstance(self.content, list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                             for p in self.content):
            return {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        try:
            content = text_content(self.content, where)
        except RowError as exc:
            raise APIError(400, str(exc), param=where) from None
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatCompletionRequest(_RequestBase):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("`top_logprobs` needs `logprobs: true`")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_RequestBase):
    # a string or a list of token ids (as vLLM takes them), or a list of one of either
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] | list[list[Annotated[int, Field(ge=0)]]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("send one prompt per request (a list of exactly one string or token-id list)")
            value = value[0]
        if not value:
            raise ValueError("`prompt` is empty")
        return value

    def token_ids(self) -> list[int] | None:
        """The prompt's token ids when it was sent as ids, else None."""
        return self.prompt if isinstance(self.prompt, list) else None

    def logprobs_count(self) -> int | None:
        return self.logprobs


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None  # {cached_tokens}: prompt tokens found in the prefix cache

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None = None) -> "Usage":
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=None if cached is None else {"cached_tokens": cached})


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


def _now() -> int:
    return int(time.time())


class _Choice(BaseModel):
    """What every choice (whole or streamed) carries besides its text."""

    index: int
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class _Response(BaseModel):
    """The envelope of every completion response and chunk."""

    id: str
    created: int = Field(default_factory=_now)
    model: str
    usage: Usage | None = None


class ChatChoice(_Choice):
    message: ResponseMessage


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Choice):
    delta: DeltaMessage


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class CompletionChoice(_Choice):
    text: str


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "fleetllm"
    max_model_len: int | None = None
    parent: str | None = None  # a LoRA adapter's base model id (vLLM's --lora-modules cards)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A pydantic error list -> (one message naming every problem, each with pydantic's error type as vLLM's
    messages carry it, e.g. [type=less_than_equal]; the first offending parameter)."""
    problems = validation_problems(errors, root="body", skip=("body",))
    kinds = [err.get("type") for err in errors]
    parts = [f"{where}: {what}" + (f" [type={kind}]" if kind and kind not in ("value_error", "assertion_error")
                                   else "") for (where, what), kind in zip(problems, kinds)]
    return "; ".join(parts), (problems[0][0] if problems else None)
