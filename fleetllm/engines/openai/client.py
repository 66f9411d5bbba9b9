"""Async calls to an OpenAI-compatible endpoint through the official `openai` client.

`AsyncOpenAI(max_retries=0)` sends each attempt; the retry loop here owns the policy:

- 408, 429, 5xx, timeouts and connection errors are retried with exponential backoff and jitter
  (`backoff_delay`), waiting at least the server's Retry-After;
  the server's Retry-After is obeyed up to `max_backoff_s` (a Retry-After: 3600 waits max_backoff_s),
  and each wait of a second or more is told to `wait_listeners` (the job's progress line) and logged;
- a 200 that is not a well-formed completion (not JSON, no choices, fewer than `n`, a choice without
  its message or text: `answers.check_completion`) is retried like a 5xx;
- other 4xx (400, 422, ...) are not retried: the row keeps the error; so does an answer larger than
  the size cap (`answers.capped_http_client`);
- after `max_retries` retries the row keeps its last error; a row is never dropped;
- failures that are not the row's fault come back with `endpoint_error` set, a message naming the
  endpoint, what it answered and the fix: callers stop instead of recording them as the row's result
  (`EndpointError`). They are: 401/403 (the api key), 404 (the model or route), the endpoint
  unreachable after the retries (`endpoint_problem`); and, after the retries (`endpoint_wide`), an
  answer that is still not a well-formed completion, a 429 or 503 (the endpoint is rate-limiting or
  unavailable, never the row's content), and any other retryable failure (500, 502, 504, 408,
  timeouts) while no other request to the endpoint succeeded since the row's first attempt (an
  outage or a hang, not this row). A 5xx or timeout of one row while others succeed stays its error.

Every attempt goes through the AIMD window (`AsyncWindow` around `AIMDController`), which learns
from each outcome. Sleep, clock and random are injectable so tests assert the exact backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from fleetllm.engines.openai.aimd import AIMDController, Signal, Ticket
from fleetllm.engines.openai.answers import BadAnswer, check_completion
from fleetllm.engines.openai.failures import (  # noqa: F401 (classify, parse_retry_after: their old home)
    Failure, classify, endpoint_problem, endpoint_wide, parse_retry_after,
)

Sleep = Callable[[float], Awaitable[Any]]
log = logging.getLogger("fleetllm.openai")
# Called with one line whenever a request waits a second or more before its retry (the batch runner
# shows it on the job's progress line); process-wide, as the engine's requests run on its own loop.
wait_listeners: list[Callable[[str], None]] = []


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
        max_response_bytes: int = 64 * 2 ** 20,
    ) -> None:
        if openai_client is None:
            from openai import AsyncOpenAI

            from fleetllm.engines.openai.answers import capped_http_client

            openai_client = AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                        max_retries=0, http_client=capped_http_client(max_response_bytes, timeout_s),
                                        default_headers=headers or None)
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
        self.successes = 0  # answers taken: a row's failure while none came is the endpoint's (endpoint_wide)

    async def chat(self, messages: list[dict[str, Any]], **options: Any) -> CallResult:
        """One chat completion (POST /chat/completions) with retries."""
        n = int(options.get("n") or 1)
        return await self._call(lambda: self.openai.chat.completions.create(
            model=self.model, messages=messages, **options), lambda r: _parse(r, n, chat=True))

    async def complete(self, prompt: str, **options: Any) -> CallResult:
        """One text completion (POST /completions) with retries."""
        n = int(options.get("n") or 1)
        return await self._call(lambda: self.openai.completions.create(
            model=self.model, prompt=prompt, **options), lambda r: _parse(r, n, chat=False))

    async def embed(self, input: str | list[int], **options: Any) -> CallResult:
        """One embedding (POST /embeddings) of one text or token-id list, with retries; the vector is
        taken as floats (the client asks for base64 and decodes it when encoding_format is left out)."""
        return await self._call(lambda: self.openai.embeddings.create(model=self.model, input=input, **options),
                                _parse_embedding)

    async def _call(self, send: Callable[[], Awaitable[Any]],
                    parse: Callable[[Any], CallResult] | None = None) -> CallResult:
        parse = parse or _parse
        attempts, first, successes_before = 0, None, self.successes
        while True:
            ticket = await self.window.acquire()
            attempts += 1
            start = self.clock()
            first = start if first is None else first
            try:  # an answer that is not a well-formed completion fails here like a 5xx (BadAnswer)
                result = parse(await send())
            except Exception as exc:  # every failure is classified; none escapes the row
                latency = self.clock() - start
                failure = classify(exc)
                retry_after = self._capped(failure.retry_after_s)
                if failure.signal is not None:
                    self.window.overload(ticket, failure.signal, retry_after)
                else:
                    self.window.other(ticket)
                if not failure.retryable or attempts > self.retry.max_retries:
                    suffix = f" (after {attempts} attempts)" if failure.retryable else ""
                    problem = endpoint_problem(failure, self.base_url, self.model) or endpoint_wide(
                        failure, self.base_url, attempts, self.successes > successes_before)
                    return CallResult(error=failure.message + suffix, attempts=attempts, latency_s=latency,
                                      elapsed_s=self.clock() - first, endpoint_error=problem)
                delay = backoff_delay(attempts - 1, self.retry, self.rand())
                if retry_after is not None:
                    delay = max(delay, retry_after)
                self.backoffs.append(delay)
                self._tell_wait(delay, failure)
                await self.sleep(delay)
                continue
            latency = self.clock() - start
            self.successes += 1
            self.window.success(ticket, latency, result.completion_tokens or None)
            result.attempts = attempts
            result.latency_s = latency
            result.elapsed_s = self.clock() - first
            return result

    def _capped(self, retry_after_s: float | None) -> float | None:
        """The server's Retry-After, at most retry.max_backoff_s."""
        return None if retry_after_s is None else min(retry_after_s, self.retry.max_backoff_s)

    def _tell_wait(self, delay: float, failure: Failure) -> None:
        """A wait of a second or more, told to the wait listeners (the progress line) and logged."""
        if delay < 1.0:
            return
        said = failure.retry_after_s
        cap = self.retry.max_backoff_s
        why = "" if said is None else (f"; Retry-After {said:g} s" + (
            f", capped at retry.max_backoff_s {cap:g} s" if said > cap else ""))
        line = f"waiting {delay:.0f} s to retry {self.base_url}: {failure.message[:160]}{why}"
        log.warning(line)
        for listener in list(wait_listeners):
            listener(line)

    async def aclose(self) -> None:
        await self.openai.close()


def _parse(response: Any, n: int = 1, chat: bool = True) -> CallResult:
    check_completion(response, n, chat)  # BadAnswer: retried, then the endpoint's failure
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
    if isinstance(response, (str, bytes)):
        check_completion(response, 1, chat=False)  # BadAnswer naming the body
    data = list(getattr(response, "data", None) or [])
    if len(data) != 1:
        raise BadAnswer(f"a 200 with {len(data)} embeddings where one was asked")
    vector = data[0].embedding
    if not isinstance(vector, list) or not vector:
        raise BadAnswer(f"a 200 whose embedding is not a list of floats ({type(vector).__name__})")
    usage = getattr(response, "usage", None)
    return CallResult(embedding=[float(x) for x in vector],
                      prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0))
