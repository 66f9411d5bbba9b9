"""The OpenAI HTTP engine: any OpenAI-compatible endpoint (vLLM, a fleetllm server, a hosted API).

`model.source` (the engine's model_path) is the served model id unless engine_kwargs.model is set.
Requests with `messages` go to /chat/completions, requests with a raw `prompt` to /completions,
embedding requests (`embed`) to /embeddings.
Every request passes through one AIMD window (`fleetllm.engines.openai.aimd`) that lives as long as the
engine, so the concurrency it learned carries over from one `generate` call to the next; retries
follow `fleetllm.engines.openai.client`. A failed row comes back with `error` set and its `attempts`; none
is dropped. The engine runs its own event loop in a thread, so `generate` is a plain call.

Failures that are not the row's (the api key refused, the model not served, the endpoint unreachable
after the retries, answers that are not well-formed completions, an endpoint-wide 429 storm, outage or
hang: `fleetllm.engines.openai.failures`) raise `EndpointError` from `generate` instead: the job stops
and commits nothing for those rows (a rerun with the fix computes them). `check_endpoint` finds the
first two before a job starts.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetllm.engines.base import (
    Completion, EmbeddingRequest, EmbeddingResult, Engine, GenerationRequest, GenerationResult, clean_sampling,
)
from fleetllm.engines.chat import check_text
from fleetllm.engines.loop_thread import LoopThread
from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController
from fleetllm.engines.openai.client import CallResult, QueryClient, RetryPolicy
from fleetllm.errors import EndpointError, EngineError, RowError, SpecError, validation_problems

# Sampling keys the OpenAI API takes as named arguments; others travel in extra_body (vLLM reads
# top_k, min_tokens, ignore_eos, repetition_penalty, chat_template_kwargs... from there).
OPENAI_KEYS = {
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
    "presence_penalty", "frequency_penalty", "logit_bias", "user", "response_format", "tools",
    "tool_choice", "timeout",
}


class OpenAIEngineKwargs(BaseModel):
    """engine_kwargs of `engine: openai`."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(..., description="Endpoint root, e.g. http://127.0.0.1:8000/v1; default: $OPENAI_BASE_URL "
                          "(as the openai client reads it).")
    api_key: str | None = Field(None, description="API key; default: the variable named by api_key_env.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    model: str | None = Field(None, description="Served model id; default: model.source.")
    timeout_s: float = Field(600.0, gt=0, description="Timeout of one HTTP attempt, in seconds.")
    max_retries: int = Field(
        5, ge=0, description="HTTP retries of one row's request (408/429/5xx, timeouts, connection errors) "
        "with exponential backoff and jitter; other 4xx are not retried. A row that still fails keeps its "
        "`error` and `attempts`. The only retry budget of this engine: compute.max_retries does not apply.")
    retry: dict[str, Any] = Field(
        default_factory=dict, description="More retry settings: initial_backoff_s, max_backoff_s (also the cap "
        "on a server's Retry-After), jitter."
    )
    max_response_mb: float = Field(
        64.0, gt=0, description="Size cap of one response body, in MiB: a larger answer is refused unread past "
        "it (read as a stream) and kept as the row's error.")
    aimd: AIMDConfig = Field(default_factory=AIMDConfig, description="Adaptive concurrency settings.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent with every request.")

    @model_validator(mode="before")
    @classmethod
    def _base_url_from_environment(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("base_url") is None:
            url = os.environ.get("OPENAI_BASE_URL")
            if not url:
                raise ValueError("base_url is missing: set engine_kwargs.base_url (e.g. http://127.0.0.1:8000/v1) "
                                 "or $OPENAI_BASE_URL")
            data = {**data, "base_url": url}
        return data


def parse_engine_kwargs(kwargs: dict[str, Any]) -> OpenAIEngineKwargs:
    try:
        return OpenAIEngineKwargs.model_validate(kwargs)
    except ValidationError as exc:
        problems = "; ".join(f"{where}: {what}" for where, what in validation_problems(exc.errors()))
        raise SpecError(
            f"engine_kwargs for engine openai are invalid ({problems}); "
            f"known settings: {sorted(OpenAIEngineKwargs.model_fields)}"
        ) from None


def openai_arguments(sampling: dict[str, Any], chat_template_kwargs: dict[str, Any] | None,
                     chat: bool) -> dict[str, Any]:
    """Split sampling settings into OpenAI keyword arguments and extra_body."""
    args: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in clean_sampling(sampling).items():
        if key == "extra_body":
            extra.update(value or {})
        elif key == "logprobs":
            if chat:
                args["logprobs"], args["top_logprobs"] = True, int(value)
            else:
                args["logprobs"] = int(value)
        elif key in OPENAI_KEYS:
            args[key] = value
        else:
            extra[key] = value
    if chat and chat_template_kwargs:
        extra["chat_template_kwargs"] = {**chat_template_kwargs, **extra.get("chat_template_kwargs", {})}
    if extra:
        args["extra_body"] = extra
    return args


def to_result(call: CallResult, n: int) -> GenerationResult:
    """A GenerationResult (with `attempts`) from one row's CallResult."""
    if call.error is not None:
        result = GenerationResult.failed(call.error, num_input_tokens=call.prompt_tokens)
    else:
        per_choice = call.completion_tokens // max(1, len(call.choices)) if len(call.choices) > 1 \
            else call.completion_tokens
        completions = [Completion(text=c.text, num_generated_tokens=per_choice,
                                  finish_reason=c.finish_reason or "stop", index=c.index)
                       for c in call.choices]
        result = GenerationResult(completions=completions, num_input_tokens=call.prompt_tokens,
                                  num_cached_tokens=call.cached_tokens)
    result.attempts = call.attempts
    return result


def check_endpoint(model_path: str, engine_kwargs: dict[str, Any], attempts: int = 3) -> None:
    """Before a job starts: GET {base_url}/models with the job's key. EndpointError naming the cause
    and the fix when the key is refused, the model is not listed, or the endpoint cannot be reached
    (after `attempts` tries). An endpoint without /models (404 there) is let through."""
    import time

    import openai

    from fleetllm.engines.openai.client import classify, endpoint_problem

    s = parse_engine_kwargs(engine_kwargs)
    model = s.model or model_path
    key = s.api_key or os.environ.get(s.api_key_env) or "EMPTY"
    client = openai.OpenAI(base_url=s.base_url, api_key=key, timeout=min(s.timeout_s, 30.0), max_retries=0)
    try:
        for attempt in range(attempts):
            try:
                served = [m.id for m in client.models.list()]
                break
            except openai.NotFoundError:
                return
            except Exception as exc:
                failure = classify(exc)
                problem = endpoint_problem(failure, s.base_url, model)
                if problem is None:
                    return  # an answer that says nothing about the key or the model: let rows find out
                if failure.status is not None or attempt == attempts - 1:
                    raise EndpointError(problem) from None
                time.sleep(0.5 * 2 ** attempt)
    finally:
        client.close()
    if served and model not in served:
        raise EndpointError(f"the endpoint {s.base_url} does not serve model {model!r} (it lists {served[:20]}); "
                            "set model.source (or model.engine_kwargs.model) to one of them, then run again")


class OpenAIHTTPEngine(Engine):
    name = "openai"
    concurrent_batches = True
    retries_requests = True  # engine_kwargs.max_retries; the batch stage adds no retries on top
    tasks = ("generate", "embed")  # whatever the endpoint serves: it refuses what its model cannot do

    def start(self) -> None:
        self.settings = parse_engine_kwargs(self.engine_kwargs)
        s = self.settings
        self.served_model = s.model or self.model_path
        self.api_key = s.api_key or os.environ.get(s.api_key_env)
        self.controller = AIMDController(s.aimd)
        self.retry = RetryPolicy(max_retries=s.max_retries, **s.retry)
        self._loop = LoopThread("openai-engine-loop")
        self.client: QueryClient = self._run(self._make_client()).result()

    async def _make_client(self) -> QueryClient:
        return QueryClient(base_url=self.settings.base_url, model=self.served_model, api_key=self.api_key,
                           timeout_s=self.settings.timeout_s, retry=self.retry, controller=self.controller,
                           headers=self.settings.headers,
                           max_response_bytes=int(self.settings.max_response_mb * 2 ** 20))

    def _run(self, coro) -> Future:
        if getattr(self, "_loop", None) is None:
            coro.close()
            raise EngineError("the openai engine is not started; call start() first")
        return self._loop.submit(coro)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Send the batch under the AIMD window; one result per request, in order."""
        return self.submit(requests).result()

    def submit(self, requests: list[GenerationRequest]) -> Future:
        """Start a batch on the engine's loop; a concurrent.futures.Future of its results."""
        return self._run(self._generate(requests))

    async def _generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: GenerationRequest) -> GenerationResult:
        chat = request.messages is not None
        try:  # the field table: what this engine sends, and the values' types and ranges
            sampling = self.check_sampling(request.sampling)
            check_text(request)  # a lone surrogate cannot be sent as UTF-8: the row's error, never retried
        except RowError as exc:
            return GenerationResult.failed(str(exc))
        if request.structured is not None:  # response_format (JSON) or vLLM's structured_outputs
            sampling.update(request.structured.request_fields())
        args = openai_arguments(sampling, {**self.chat_template_kwargs,
                                                   **(request.chat_template_kwargs or {})}, chat)
        n = int(args.get("n", 1) or 1)
        try:
            if chat:
                from fleetllm.engines.chat import normalize_messages

                call = await self.client.chat(normalize_messages(request.messages, text_only=False), **args)
            else:
                call = await self.client.complete(request.prompt, **args)
        except Exception as exc:  # a malformed row fails alone
            return GenerationResult.failed(f"could not send the request: {exc}")
        if call.endpoint_error is not None:  # not the row's fault: never its result
            raise EndpointError(call.endpoint_error)
        return to_result(call, n)

    # --- embeddings: POST /embeddings, one row per request under the same AIMD window and retries ---

    def embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        return self.submit_embed(requests).result()

    def submit_embed(self, requests: list[EmbeddingRequest]) -> Future:
        """Start a batch of embeddings on the engine's loop; a concurrent.futures.Future of its results."""
        return self._run(self._embed(requests))

    async def aembed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        return await asyncio.wrap_future(self.submit_embed(requests))

    async def _embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        return list(await asyncio.gather(*(self._embed_one(r) for r in requests)))

    async def _embed_one(self, request: EmbeddingRequest) -> EmbeddingResult:
        options: dict[str, Any] = {"encoding_format": "float"}
        if request.dimensions is not None:
            options["dimensions"] = int(request.dimensions)
        value = request.text if request.token_ids is None else [int(t) for t in request.token_ids]
        try:
            call = await self.client.embed(value, **options)
        except Exception as exc:  # a malformed row fails alone
            return EmbeddingResult.failed(f"could not send the request: {exc}")
        if call.endpoint_error is not None:  # not the row's fault: never its result
            raise EndpointError(call.endpoint_error)
        if call.error is not None:
            result = EmbeddingResult.failed(call.error, num_input_tokens=call.prompt_tokens)
        else:
            result = EmbeddingResult(embedding=call.embedding, num_input_tokens=call.prompt_tokens)
        result.attempts = call.attempts
        return result

    def stop(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        try:
            self._run(self.client.aclose()).result(timeout=10)
        except Exception:
            pass
        loop.close()
        self._loop = None

    @property
    def version(self) -> str:
        import openai

        return f"openai-{openai.__version__}"
