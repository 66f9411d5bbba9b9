"""Async calls to an OpenAI-compatible endpoint through the official `openai` client.

`AsyncOpenAI(max_retries=0)` sends each attempt; the retry loop here owns the policy:

- 408, 429, 5xx, timeouts and connection errors are retried with exponential backoff and jitter
  (`backoff_delay`), waiting at least the server's Retry-After;
- other 4xx (400, 422, ...) are not retried: the row keeps the error;
- after `max_retries` retries the row keeps its last error; a row is never dropped;
- failures that are not the row's fault (401/403: the api key; 404: the model or route; the endpoint
  unreachable after the retries) come back with `endpoint_error` set, a message naming the cause and
  the fix: callers stop instead of recording them as the row's result (`EndpointError`).

Every attempt goes through the AIMD window (`AsyncWindow` around `AIMDController`), which learns
from each outcome. Sleep, clock and random are injectable so tests assert the exact backoff.
"""

from __future__ import annotations

import asyncio
import email.utils
import random as _random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from fleetllm.engines.openai.aimd import AIMDController, Signal, Ticket

Sleep = Callable[[float], Awaitable[Any]]


class RetryPolicy(BaseModel):
    """Retries of one request (per row)."""

    model_config = ConfigDict(extra="forbid")

    max_retries: int = Field(5, ge=0, description="Retries after the first attempt before the row keeps its error.")
    initial_backoff_s: float = Field(0.5, ge=0, description="Backoff before the first retry, before jitter.")
    max_backoff_s: float = Field(30.0, ge=0, description="Cap on one backoff, before jitter.")
    jitter: float = Field(
        0.5, ge=0, le=1, description="Fraction of each backoff that is random: delay = d*(1-jitter) + d*jitter*U[0,1)."
    )


def backoff_delay(retry: int, policy: RetryPolicy, rand: float) -> float:
    """Seconds to wait before retry number `retry` (0-based), given a uniform draw `rand` in [0, 1)."""
    d = min(policy.max_backoff_s, policy.initial_backoff_s * (2.0 ** retry))
    return d * (1.0 - policy.jitter) + d * policy.jitter * rand


@dataclass
class Choice:
    text: str
    finish_reason: str | None
    index: int = 0


@dataclass
class CallResult:
    """The outcome of one row: its choices, or the error it kept after its attempts."""

    choices: list[Choice] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    attempts: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server says
    embedding: list[float] | None = None  # the vector of an embeddings call
    endpoint_error: str | None = None  # not the row's fault: the caller stops (see endpoint_problem)
    latency_s: float = 0.0  # the successful attempt's latency (or the last attempt's)
    elapsed_s: float = 0.0  # from the first attempt's send to the result, backoffs included

    @property
    def content(self) -> str | None:
        return self.choices[0].text if self.choices else None

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason if self.choices else None


@dataclass
class Failure:
    """How an attempt failed, as the retry loop and the controller see it."""

    message: str
    retryable: bool
    signal: Signal | None = None  # a load signal for the controller, if any
    retry_after_s: float | None = None
    status: int | None = None


def parse_retry_after(headers: Any) -> float | None:
    """Retry-After in seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify(exc: BaseException) -> Failure:
    """Map an exception from the openai client onto retry and load-signal decisions."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return Failure(f"timeout: {exc}", retryable=True, signal=Signal.TIMEOUT)
    if isinstance(exc, openai.APIConnectionError):
        return Failure(f"connection error: {exc}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry_after = parse_retry_after(getattr(exc.response, "headers", None))
        message = f"HTTP {status}: {_short(exc)}"
        if status == 429:
            return Failure(message, True, Signal.RATE_LIMIT, retry_after, status)
        if status in (503, 504):
            return Failure(message, True, Signal.UNAVAILABLE, retry_after, status)
        if status == 408 or status >= 500:
            return Failure(message, True, None, retry_after, status)
        return Failure(message, False, None, None, status)
    return Failure(f"{type(exc).__name__}: {exc}", retryable=False)


def endpoint_problem(failure: Failure, base_url: str, model: str) -> str | None:
    """The cause and the fix when a final failure is the endpoint's, not the row's; else None."""
    if failure.status in (401, 403):
        return (f"the endpoint {base_url} refused the api key ({failure.message}); set "
                "model.engine_kwargs.api_key, or the variable named by model.engine_kwargs.api_key_env "
                "(default OPENAI_API_KEY), to a key it accepts, then run again")
    if failure.status == 404:
        return (f"the endpoint {base_url} does not serve model {model!r} ({failure.message}); set "
                "model.source (or model.engine_kwargs.model) to an id that GET /v1/models lists, or fix "
                "model.engine_kwargs.base_url, then run again")
    if failure.status is None and failure.message.startswith("connection error"):
        return (f"the endpoint {base_url} cannot be reached ({failure.message}); start it or fix "
                "model.engine_kwargs.base_url, then run again")
    return None


def _short(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        return str(inner)[:500]
    return str(getattr(exc, "message", exc))[:500]


class AsyncWindow:
    """Awaitable admission around an `AIMDController` (one event loop)."""

    def __init__(self, controller: AIMDController, sleep: Sleep | None = None) -> None:
        self.controller = controller
        self.sleep = sleep or asyncio.sleep
        self._waiters: list[asyncio.Future] = []

    async def acquire(self) -> Ticket:
        while True:
            ticket = self.controller.try_acquire()
            if ticket is not None:
                return ticket
            pause = self.controller.pause_remaining()
            if pause > 0:
                await self.sleep(pause)
                continue
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def _wake(self) -> None:
        """Wake as many waiters (oldest first) as there are free slots; the others keep waiting."""
        free = self.controller.limit - self.controller.in_flight
        while free > 0 and self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                free -= 1

    def success(self, ticket: Ticket, latency_s: float, completion_tokens: int | None) -> None:
        self.controller.on_success(ticket, latency_s, completion_tokens)
        self._wake()

    def overload(self, ticket: Ticket, signal: Signal, retry_after_s: float | None) -> None:
        self.controller.on_overload(ticket, signal, retry_after_s)
        self._wake()

    def other(self, ticket: Ticket) -> None:
        self.controller.on_other(ticket)
        self._wake()


class QueryClient:
    """Sends rows to one endpoint and model under an AIMD window, with retries.

    Create it inside the event loop that will use it (the openai client binds to that loop).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        controller: AIMDController | None = None,
        window: AsyncWindow | None = None,
        sleep: Sleep | None = None,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = _random.random,
        openai_client: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if openai_client is None:
            from openai import AsyncOpenAI

            openai_client = AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY",
                                        timeout=timeout_s, max_retries=0, default_headers=headers or None)
        self.openai = openai_client
        self.model = model
        self.base_url = base_url
        self.retry = retry or RetryPolicy()
        self.sleep = sleep or asyncio.sleep
        if window is not None:  # a window shared by several clients on one event loop
            self.window, self.controller = window, window.controller
        else:
            self.controller = controller or AIMDController()
            self.window = AsyncWindow(self.controller, self.sleep)
        self.clock = clock
        self.rand = rand
        self.backoffs: list[float] = []  # every backoff slept, in order (for logs and tests)

    async def chat(self, messages: list[dict[str, Any]], **options: Any) -> CallResult:
        """One chat completion (POST /chat/completions) with retries."""
        return await self._call(lambda: self.openai.chat.completions.create(
            model=self.model, messages=messages, **options))

    async def complete(self, prompt: str, **options: Any) -> CallResult:
        """One text completion (POST /completions) with retries."""
        return await self._call(lambda: self.openai.completions.create(
            model=self.model, prompt=prompt, **options))

    async def embed(self, input: str | list[int], **options: Any) -> CallResult:
        """One embedding (POST /embeddings) of one text or token-id list, with retries; the vector is
        taken as floats (the client asks for base64 and decodes it when encoding_format is left out)."""
        return await self._call(lambda: self.openai.embeddings.create(model=self.model, input=input, **options),
                                _parse_embedding)

    async def _call(self, send: Callable[[], Awaitable[Any]],
                    parse: Callable[[Any], CallResult] | None = None) -> CallResult:
        attempts = 0
        first: float | None = None
        while True:
            ticket = await self.window.acquire()
            attempts += 1
            start = self.clock()
            first = start if first is None else first
            try:
                response = await send()
            except Exception as exc:  # every failure is classified; none escapes the row
                latency = self.clock() - start
                failure = classify(exc)
                if failure.signal is not None:
                    self.window.overload(ticket, failure.signal, failure.retry_after_s)
                else:
                    self.window.other(ticket)
                if not failure.retryable or attempts > self.retry.max_retries:
                    suffix = f" (after {attempts} attempts)" if failure.retryable else ""
                    return CallResult(error=failure.message + suffix, attempts=attempts, latency_s=latency,
                                      elapsed_s=self.clock() - first,
                                      endpoint_error=endpoint_problem(failure, self.base_url, self.model))
                delay = backoff_delay(attempts - 1, self.retry, self.rand())
                if failure.retry_after_s is not None:
                    delay = max(delay, failure.retry_after_s)
                self.backoffs.append(delay)
                await self.sleep(delay)
                continue
            latency = self.clock() - start
            try:
                result = (parse or _parse)(response)
            except Exception as exc:
                self.window.other(ticket)
                return CallResult(error=f"unreadable response: {exc}", attempts=attempts, latency_s=latency)
            self.window.success(ticket, latency, result.completion_tokens or None)
            result.attempts = attempts
            result.latency_s = latency
            result.elapsed_s = self.clock() - first
            return result

    async def aclose(self) -> None:
        await self.openai.close()


def _parse(response: Any) -> CallResult:
    choices = []
    for i, ch in enumerate(response.choices):
        message = getattr(ch, "message", None)
        text = (message.content if message is not None else getattr(ch, "text", None)) or ""
        choices.append(Choice(text=text, finish_reason=ch.finish_reason, index=getattr(ch, "index", i) or i))
    usage = getattr(response, "usage", None)
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    return CallResult(
        choices=choices,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cached_tokens=int(cached) if cached is not None else None,
    )


def _parse_embedding(response: Any) -> CallResult:
    data = list(response.data)
    if len(data) != 1:
        raise ValueError(f"expected one embedding, got {len(data)}")
    vector = data[0].embedding
    if not isinstance(vector, list) or not vector:
        raise ValueError(f"the embedding is not a list of floats ({type(vector).__name__})")
    usage = getattr(response, "usage", None)
    return CallResult(embedding=[float(x) for x in vector],
                      prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0))
