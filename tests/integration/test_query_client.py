"""The query client through the official openai client against the real capacity-limited HTTP server."""

from __future__ import annotations

import asyncio

import pytest

from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController
from fleetllm.engines.openai.client import QueryClient, RetryPolicy
from fleetllm.testing.capacity_server import CapacityServer


@pytest.fixture(scope="module")
def server():
    with CapacityServer(capacity=4, latency_s=0.002) as srv:
        yield srv


def test_every_row_gets_its_own_answer(server):
    async def main():
        client = QueryClient(base_url=server.base_url, model="capacity-test",
                             controller=AIMDController(AIMDConfig(initial_window=8)))
        chats = [client.chat([{"role": "user", "content": f"question {i}"}], max_tokens=16) for i in range(60)]
        texts = [client.complete(f"prompt {i}", max_tokens=2) for i in range(20)]
        out = await asyncio.gather(*chats, *texts)
        await client.aclose()
        return out

    results = asyncio.run(main())
    for i, r in enumerate(results[:60]):
        assert r.error is None and r.content == f"echo: question {i}" and r.finish_reason == "stop"
        assert r.prompt_tokens == 2 and r.completion_tokens == 3 and r.attempts >= 1
    for i, r in enumerate(results[60:]):
        assert r.content == "echo: prompt" and r.finish_reason == "length" and r.completion_tokens == 2


def test_exact_backoff_against_a_failing_server():
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    draws = iter([0.0, 1.0, 0.5])
    with CapacityServer(capacity=None, latency_s=0.0, failure_rate=1.0) as srv:
        async def main():
            client = QueryClient(base_url=srv.base_url, model="capacity-test", sleep=sleep,
                                 rand=lambda: next(draws),
                                 retry=RetryPolicy(max_retries=3, initial_backoff_s=0.2, jitter=0.5))
            r = await client.chat([{"role": "user", "content": "x"}])
            await client.aclose()
            return r

        result = asyncio.run(main())
        stats = srv.stats()
    assert slept == pytest.approx([0.1, 0.4, 0.6])  # d = 0.2, 0.4, 0.8; d/2 + d/2 * rand
    assert result.attempts == 4 and stats["requests"] == 4 and stats["failed"] == 4
    assert result.error.startswith("HTTP 503") and result.content is None


def test_not_found_model_is_not_retried(server):
    async def main():
        client = QueryClient(base_url=server.base_url, model="no-such-model")
        r = await client.chat([{"role": "user", "content": "x"}])
        await client.aclose()
        return r

    r = asyncio.run(main())
    assert r.attempts == 1 and r.error.startswith("HTTP 404") and "no-such-model" in r.error


def test_429_retry_after_is_honoured():
    # capacity 1, hard limit 1: the second of two concurrent requests gets 429 with Retry-After 0.3 s
    with CapacityServer(capacity=1, hard_limit=1, latency_s=0.1, retry_after_s=0.3) as srv:
        async def main():
            client = QueryClient(base_url=srv.base_url, model="capacity-test",
                                 retry=RetryPolicy(initial_backoff_s=0.01),
                                 controller=AIMDController(AIMDConfig(initial_window=2)))
            out = await asyncio.gather(*(client.chat([{"role": "user", "content": f"r{i}"}]) for i in range(2)))
            await client.aclose()
            return client, out

        client, out = asyncio.run(main())
        stats = srv.stats()
    assert all(r.error is None for r in out)
    assert sorted(r.attempts for r in out) == [1, 2] and stats["rate_limited"] == 1
    assert client.backoffs == [0.3]  # the wait is at least the server's Retry-After
    assert client.controller.stats.decreases == {"rate_limit": 1}
