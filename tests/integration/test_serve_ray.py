"""A real Ray Serve app on a free port, driven by the official `openai` client and raw HTTP: two tiny
models in one app (routing by `model`), API key, errors, overload (429 + Retry-After) and a client
disconnect that stops the engine's generation."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import openai
import pytest

from fleetllm.serve.spec import ServeSpec

KEY = "sk-ray"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(ray_local, tmp_path_factory, tiny_model):
    from fleetllm.serve.run import run_serve, stop_serve
    from fleetllm.testing.tiny_model import make_tiny_model

    long_ctx = str(make_tiny_model(tmp_path_factory.mktemp("m") / "tiny-4k", max_position_embeddings=4096))
    spec = ServeSpec.model_validate({
        "name": "test-serve", "port": free_port(), "api_key": KEY,
        "models": [
            {"model_id": "tiny", "source": long_ctx, "engine": "transformers", "max_ongoing_requests": 8,
             "max_queued_requests": 8, "cpus_per_replica": 1},
            {"model_id": "tiny-small", "source": tiny_model, "engine": "transformers",
             "max_ongoing_requests": 1, "max_queued_requests": 1, "cpus_per_replica": 1},
        ],
    })
    url = run_serve(spec)
    yield url
    stop_serve(shutdown_ray=False)


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=120)


def metric(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}{{model="{model}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_openai_client_chat_completion_stream_n_models(client):
    assert sorted(m.id for m in client.models.list().data) == ["tiny", "tiny-small"]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          temperature=0)
    assert chat.usage.completion_tokens == 6 and chat.usage.prompt_tokens > 0
    assert chat.choices[0].finish_reason == "length"
    comp = client.completions.create(model="tiny-small", prompt="Once upon a time", max_tokens=4, temperature=0)
    assert comp.usage.completion_tokens == 4 and comp.object == "text_completion"
    two = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=5, n=2, temperature=1.0, seed=7)
    assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True, temperature=0,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the stream matches the plain answer
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []


def test_errors_over_the_wire_and_the_server_keeps_serving(server, client):
    base = server.removesuffix("/v1")
    hdr = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{server}/chat/completions", content=b'{"model": "tiny", "messages": [', headers=hdr)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{server}/chat/completions", json={"model": "tiny", "messages": MSG, "max_tokens": -1},
                   headers=hdr)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=MSG)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="tiny-small", prompt="word " * 600, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server, api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server}/models").status_code == 401
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    ok = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2)
    assert ok.usage.completion_tokens == 2


MSG = [{"role": "user", "content": "hi"}]


def test_overload_gets_429_with_retry_after_while_admitted_requests_complete(server):
    body = {"model": "tiny-small", "prompt": "go", "max_tokens": 300, "ignore_eos": True, "stream": True}

    async def one(client: httpx.AsyncClient):
        async with client.stream("POST", f"{server}/completions", json=body,
                                 headers={"Authorization": f"Bearer {KEY}"}) as resp:
            raw = await resp.aread()
            return resp.status_code, resp.headers.get("retry-after"), raw.decode()

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*[one(client) for _ in range(6)])

    results = asyncio.run(go())
    statuses = sorted(s for s, _, _ in results)
    assert 429 in statuses and 200 in statuses, statuses
    for status, retry_after, text in results:
        if status == 429:
            assert int(retry_after) >= 1 and '"code":"overloaded"' in text.replace(" ", "")
        else:
            assert text.rstrip().endswith("data: [DONE]")
            usage_free = [line for line in text.splitlines() if line.startswith("data: {")]
            assert usage_free, text
    # admitted = one running + one queued; every admitted request produced its 300 tokens
    assert statuses.count(200) >= 1


def test_client_disconnect_stops_generation_in_the_engine(server):
    check_disconnect_stops_generation(server.removesuffix("/v1"), {"Authorization": f"Bearer {KEY}"}, 3500)


def check_disconnect_stops_generation(base: str, hdr: dict, max_tokens: int) -> None:
    """A streaming client that goes away after a few chunks: the engine counts the request cancelled and
    generates nothing more, well before max_tokens (shared by the separate and the direct path's tests)."""

    def engine_counters():
        text = httpx.get(f"{base}/metrics").text
        return (metric(text, "fleetllm_engine_generated_tokens", "tiny"),
                metric(text, "fleetllm_engine_cancelled_requests", "tiny"))

    tokens0, cancelled0 = engine_counters()
    body = {"model": "tiny", "prompt": "go", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, headers=hdr, timeout=60) as resp:
        assert resp.status_code == 200
        for i, _ in enumerate(resp.iter_lines()):
            if i >= 3:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 60
    while engine_counters()[1] < cancelled0 + 1:
        assert time.monotonic() < deadline, "the engine never saw the request cancelled"
        time.sleep(0.2)
    tokens1, _ = engine_counters()
    time.sleep(1.0)
    tokens2, _ = engine_counters()
    assert tokens2 == tokens1  # nothing is generating any more
    assert 0 < tokens1 - tokens0 < max_tokens  # the dropped request stopped well before its max_tokens
