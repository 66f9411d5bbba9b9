"""The retry loop: exact backoff sequence with injected sleep and random; what is and is not retried."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController
from fleetllm.engines.openai.client import QueryClient, RetryPolicy, backoff_delay, classify, parse_retry_after


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request,
                              json={"error": {"message": f"status {status}"}})
    cls = {429: openai.RateLimitError, 400: openai.BadRequestError}.get(
        status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return cls(f"status {status}", response=response, body={"error": {"message": f"status {status}"}})


class Script:
    """An injected `send`: raises the scripted exceptions, then returns a response."""

    def __init__(self, failures: list[BaseException], response=None) -> None:
        self.failures = list(failures)
        self.response = response
        self.calls = 0

    async def __call__(self):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.response


def run(script: Script, policy: RetryPolicy, rand_values: list[float]):
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    draws = iter(rand_values)

    async def main():
        client = QueryClient(base_url="http://127.0.0.1:9/v1", model="m", retry=policy, sleep=sleep,
                             rand=lambda: next(draws), openai_client=object(),
                             controller=AIMDController(AIMDConfig(initial_window=4, max_pause_s=0)))
        return await client._call(script)

    return asyncio.run(main()), slept


def test_backoff_delay_formula():
    p = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, jitter=0.5)
    assert [backoff_delay(i, p, 0.0) for i in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]
    assert [backoff_delay(i, p, 1.0) for i in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_exact_backoff_sequence_then_error_kept():
    p = RetryPolicy(max_retries=4, initial_backoff_s=1.0, max_backoff_s=5.0, jitter=0.5)
    script = Script([status_error(503)] * 10)
    result, slept = run(script, p, [0.0, 0.5, 1.0, 0.25])
    # d = 1, 2, 4, 5(capped); delay = d/2 + d/2 * rand
    assert slept == [0.5, 1.5, 4.0, 3.125]
    assert script.calls == 5 and result.attempts == 5
    assert result.error.startswith("HTTP 503") and "after 5 attempts" in result.error


def test_retry_after_sets_the_least_wait():
    p = RetryPolicy(max_retries=2, initial_backoff_s=0.1, jitter=0.0)
    script = Script([status_error(429, {"retry-after": "3"}), openai.APITimeoutError(
        request=httpx.Request("POST", "http://x"))], response=None)
    result, slept = run(script, p, [0.0, 0.0])
    assert slept == [3.0, 0.2]
    assert script.calls == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_not_retried(status):
    script = Script([status_error(status)])
    result, slept = run(script, RetryPolicy(max_retries=5), [])
    assert slept == [] and script.calls == 1 and result.attempts == 1
    assert result.error.startswith(f"HTTP {status}") and "after" not in result.error


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retryable_statuses(status):
    assert classify(status_error(status)).retryable


def test_connection_errors_are_retried_without_load_signal():
    f = classify(openai.APIConnectionError(request=httpx.Request("POST", "http://x")))
    assert f.retryable and f.signal is None
    t = classify(openai.APITimeoutError(request=httpx.Request("POST", "http://x")))
    assert t.retryable and t.signal is not None


def test_parse_retry_after():
    assert parse_retry_after(httpx.Headers({"retry-after": "2"})) == 2.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "1"})) == 0.25
    assert parse_retry_after(httpx.Headers({})) is None
    assert parse_retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
