"""The direct path (the model's deployment is the Serve ingress) against the separate one (OpenAIIngress in
front), each a real Ray Serve app of the same tiny model: which deployments each app runs, the same answers
and headers through both, the API key, 429 + Retry-After with the OpenAI body when the replica's queue is
full (while /health still answers), and a client disconnect that stops the engine's generation."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from fleetllm.errors import SpecError
from fleetllm.serve.spec import ServeSpec
from fleetllm.testing.serve_process import free_port
from test_serve_ray import check_disconnect_stops_generation

KEY = "sk-direct"
HDR = {"Authorization": f"Bearer {KEY}"}


def spec(name: str, model: str, ingress: str, **extra) -> ServeSpec:
    return ServeSpec.model_validate({"name": name, "port": free_port(), "api_key": KEY, "ingress": ingress,
                                     "models": [{"model_id": "tiny", "source": model, "engine": "transformers",
                                                 "cpus_per_replica": 0.5, **extra}]})


def wait_running(name: str) -> None:
    from ray import serve

    deadline = time.monotonic() + 300
    while serve.status().applications[name].status != "RUNNING":
        assert time.monotonic() < deadline, serve.status().applications[name]
        time.sleep(0.5)


@pytest.fixture(scope="module")
def apps(ray_local, tiny_model):
    """The same model served twice in one Serve instance: app `direct` (auto) at /d, `separate` at /s."""
    from ray import serve

    from fleetllm.serve.app import build_openai_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for name, ingress, prefix in (("direct", "auto", "/d"), ("separate", "separate", "/s")):
        s = spec(name, tiny_model, ingress, max_ongoing_requests=1, max_queued_requests=1)
        serve.run(build_openai_app({"llm_configs": s.llm_configs(), "api_key": KEY, "ingress": ingress}),
                  name=name, route_prefix=prefix, blocking=False)
    for name in ("direct", "separate"):
        wait_running(name)
    yield {"direct": f"http://127.0.0.1:{port}/d", "separate": f"http://127.0.0.1:{port}/s"}
    for name in ("direct", "separate"):
        serve.delete(name)
    serve.shutdown()


def test_each_app_runs_the_deployments_of_its_path(apps):
    from ray import serve

    deployments = {name: sorted(serve.status().applications[name].deployments) for name in apps}
    assert deployments == {"direct": ["LLMServer-tiny"], "separate": ["LLMServer-tiny", "OpenAIIngress"]}


def test_both_paths_answer_the_same(apps):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}
    seen = {}
    for path, base in apps.items():
        plain = httpx.post(f"{base}/v1/chat/completions", json=body, headers=HDR, timeout=120)
        streamed = httpx.post(f"{base}/v1/chat/completions", json={**body, "stream": True,
                              "stream_options": {"include_usage": True}}, headers=HDR, timeout=120)
        assert plain.status_code == streamed.status_code == 200, (plain.text, streamed.text)
        events = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        out = plain.json()
        assert text == out["choices"][0]["message"]["content"] and streamed.text.rstrip().endswith("[DONE]")
        assert events[-1]["usage"] == out["usage"]
        assert re.fullmatch(r"[0-9a-z]+", plain.headers["x-fleetllm-replica"])
        assert plain.headers["content-type"] == "application/json"
        assert streamed.headers["content-type"].startswith("text/event-stream")
        models = httpx.get(f"{base}/v1/models", headers=HDR).json()
        seen[path] = (out["choices"][0]["message"], out["choices"][0]["logprobs"], out["usage"],
                      out["choices"][0]["finish_reason"], sorted(plain.headers.keys() - {"date", "content-length",
                      "x-request-id", "x-fleetllm-replica"}), [m["id"] for m in models["data"]],
                      [m["max_model_len"] for m in models["data"]])
        assert httpx.get(f"{base}/v1/models").status_code == 401  # the API key holds on both paths
        bad = httpx.post(f"{base}/v1/chat/completions", json={**body, "max_tokens": -1}, headers=HDR)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        assert httpx.get(f"{base}/health").json() == {"status": "ok", "models": ["tiny"]}
    assert seen["direct"] == seen["separate"]


def test_direct_replica_full_gives_429_with_retry_after_while_health_answers(apps):
    base = apps["direct"]
    body = {"model": "tiny", "prompt": "go", "max_tokens": 200, "ignore_eos": True, "stream": True}

    async def one(client: httpx.AsyncClient):
        async with client.stream("POST", f"{base}/v1/completions", json=body, headers=HDR) as resp:
            raw = await resp.aread()
            return resp.status_code, resp.headers.get("retry-after"), raw.decode()

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            runs = [asyncio.create_task(one(client)) for _ in range(5)]
            await asyncio.sleep(1.0)
            health = await client.get(f"{base}/health")  # answers while the model's queue is full
            return await asyncio.gather(*runs), health

    results, health = asyncio.run(go())
    assert health.status_code == 200
    statuses = sorted(s for s, _, _ in results)
    assert statuses.count(200) == 2 and statuses.count(429) == 3, statuses  # 1 running + 1 queued
    for status, retry_after, text in results:
        if status == 429:
            assert int(retry_after) >= 1 and json.loads(text)["error"]["code"] == "overloaded"
        else:
            assert text.rstrip().endswith("data: [DONE]")


def test_direct_client_disconnect_stops_generation_in_the_engine(apps):
    base = apps["direct"]
    check_disconnect_stops_generation(base, HDR, 500)
    metrics = httpx.get(f"{base}/metrics").text
    assert re.search(r'^fleetllm_requests_in_flight\{model="tiny"\} 0\.0$', metrics, re.M)  # the API let it go


def test_ingress_choice_is_validated_and_named(tiny_model):
    from fleetllm.serve.app import build_openai_app
    from fleetllm.serve.run import ingress_line

    two = {"name": "x", "ingress": "direct", "models": [{"model_id": "a"}, {"model_id": "b"}]}
    with pytest.raises(ValueError, match="ingress: direct cannot serve this app: the app serves 2 models"):
        ServeSpec.model_validate(two)
    with pytest.raises(ValueError, match="routing: prefix_affinity"):
        ServeSpec.model_validate({"ingress": "direct", "models": [{"model_id": "a", "routing": "prefix_affinity"}]})
    assert ingress_line(ServeSpec.model_validate({**two, "ingress": "auto"})).startswith("ingress: separate")
    assert ingress_line(spec("x", tiny_model, "auto")).startswith("ingress: direct")
    cfgs = [m.to_llm_config() for m in ServeSpec.model_validate({**two, "ingress": "auto"}).models]
    with pytest.raises(SpecError, match="ingress: direct cannot"):
        build_openai_app({"llm_configs": cfgs, "ingress": "direct"})
    with pytest.raises(SpecError, match="not one of auto, direct, separate"):
        build_openai_app({"llm_configs": cfgs[:1], "ingress": "sideways"})
    # the app's ingress deployment, as Serve (and the RayService builder) gets it
    assert build_openai_app({"llm_configs": cfgs[:1]})._bound_deployment.name == "LLMServer-a"
    assert build_openai_app({"llm_configs": cfgs[:1], "ingress": "separate"})._bound_deployment.name == "OpenAIIngress"
    from fleetllm.cluster.serve_adapter import app_from_spec

    one = {"name": "x", "models": [{"model_id": "a"}]}
    assert app_from_spec({"spec": one})._bound_deployment.name == "LLMServer-a"
    assert app_from_spec({"spec": {**one, "ingress": "separate"}})._bound_deployment.name == "OpenAIIngress"


def test_direct_path_with_two_replicas_answers_from_both(apps, tiny_model):
    from ray import serve

    from fleetllm.serve.app import build_openai_app
    from fleetllm.serve.run import ingress_line

    s = spec("direct-two", tiny_model, "auto", replicas=2, max_ongoing_requests=2, max_queued_requests=2)
    assert ingress_line(s).startswith("ingress: direct")
    serve.run(build_openai_app({"llm_configs": s.llm_configs(), "api_key": KEY}), name="direct-two",
              route_prefix="/two", blocking=False)
    wait_running("direct-two")
    url = apps["direct"].removesuffix("/d") + "/two/v1"
    body = {"model": "tiny", "prompt": "go", "max_tokens": 200, "ignore_eos": True}

    async def go(n: int):
        async with httpx.AsyncClient(timeout=120, headers=HDR) as client:
            return await asyncio.gather(*[client.post(f"{url}/completions", json=body) for _ in range(n)])

    try:  # several replicas: Serve's router queues (2 running per replica; its queue holds 2 x 2)
        replies = asyncio.run(go(4))
        assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
        assert len({r.headers["x-fleetllm-replica"] for r in replies}) == 2  # no replica takes more than its 2
        assert {r.json()["usage"]["completion_tokens"] for r in replies} == {200}
        # past Serve's queue (4 running + at most 2 x 2 queued: 12 is past it however the arrivals interleave;
        # 8 filled it exactly and came back all 200 once): 429 + Retry-After from Serve's proxy
        replies = asyncio.run(go(12))
        statuses = sorted(r.status_code for r in replies)
        assert statuses.count(200) >= 4 and 429 in statuses, statuses
        assert all(int(r.headers["retry-after"]) >= 1 for r in replies if r.status_code == 429)
        assert sorted(serve.status().applications["direct-two"].deployments) == ["LLMServer-tiny"]
    finally:
        serve.delete("direct-two")
