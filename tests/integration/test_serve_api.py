"""The OpenAI API in-process (FastAPI through httpx's ASGITransport) over the real transformers engine
on a tiny random model: protocol, errors, batching of concurrent requests, health."""

from __future__ import annotations

import re
import asyncio
import json
import shutil

import httpx
import pytest

from fleetllm.engines.transformers_engine import TransformersEngine
from fleetllm.serve.api import make_api
from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.serve.spec import LLMConfig

KEY = "sk-test"
HDR = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def app(tiny_model, tmp_path_factory):
    # a copy of the tiny model whose chat template reads a chat_template_kwargs variable
    themed = tmp_path_factory.mktemp("themed") / "tiny"
    shutil.copytree(tiny_model, themed)
    template = themed / "chat_template.jinja"
    template.write_text("{% if shout is defined and shout %}LOUD LOUD LOUD {% endif %}" + template.read_text())
    servers = {}
    for model_id, path, kwargs in (("tiny", tiny_model, {"max_model_len": 256}), ("themed", str(themed), {})):
        engine = TransformersEngine(path, engine_kwargs=kwargs)
        engine.start()
        cfg = LLMConfig(model_loading_config=dict(model_id=model_id, model_source=path), engine="transformers")
        servers[model_id] = ModelServer(cfg, engine=engine)
    backends = {m: LocalBackend(s, max_ongoing_requests=8, max_queued_requests=0) for m, s in servers.items()}
    yield make_api(backends, api_key=KEY), servers
    for s in servers.values():
        s.engine.stop()


def call(app, *requests):
    """Run requests [(method, path, kwargs)] concurrently against the ASGI app; returns responses."""
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await asyncio.gather(*[client.request(m, p, **kw) for m, p, kw in requests])
    return asyncio.run(go())


def chat(**body):
    return ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": MSG, **body}, "headers": HDR})


def assert_openai_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param:
        assert param in (err["param"] or ""), err


def test_errors_are_openai_shaped_and_the_server_keeps_serving(app):
    api, _ = app
    long_prompt = "hello " * 400
    bad = call(
        api,
        ("POST", "/v1/chat/completions", {"content": b"{not json", "headers": HDR}),
        ("POST", "/v1/chat/completions", {"content": b"[1, 2]", "headers": HDR}),
        chat(max_tokens="ten"),
        ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": "hi"}, "headers": HDR}),
        chat(max_tokens=-3),
        chat(model="no-such-model"),
        chat(messages=[{"role": "user", "content": long_prompt}]),
        ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": MSG}}),
        ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": MSG},
                                          "headers": {"Authorization": "Bearer wrong"}}),
        ("GET", "/v1/models", {}),
    )
    for resp, (status, param) in zip(bad, [(400, None), (400, None), (400, "max_tokens"), (400, "messages"),
                                           (400, "max_tokens"), (404, "model"), (400, None), (401, None),
                                           (401, None), (401, None)]):
        assert_openai_error(resp, status, param)
    assert "context" in bad[6].json()["error"]["message"]
    assert bad[5].json()["error"]["code"] == "model_not_found"
    (ok,) = call(api, chat(max_tokens=4, temperature=0))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_chat_n_usage_logprobs_and_stream_match(app):
    api, _ = app
    plain, two, lp, stream, comp = call(
        api, chat(max_tokens=8, temperature=0), chat(max_tokens=6, n=2, temperature=1.0, seed=3),
        chat(max_tokens=3, logprobs=True, top_logprobs=2, temperature=0),
        chat(max_tokens=8, stream=True, stream_options={"include_usage": True}, temperature=0),
        ("POST", "/v1/completions", {"json": {"model": "tiny", "prompt": "Once upon", "max_tokens": 5, "echo": True,
                                              "temperature": 0},
                                     "headers": HDR}),
    )
    body = plain.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 8
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    assert two.json()["usage"]["completion_tokens"] == 12
    content = lp.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == body["choices"][0]["message"]["content"]  # greedy: streamed == non-streamed
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]
    assert comp.json()["choices"][0]["text"].startswith("Once upon")
    assert comp.json()["usage"]["completion_tokens"] == 5
    (no_model,) = call(api, ("POST", "/v1/completions", {"json": {"prompt": "x"}, "headers": HDR}))
    assert_openai_error(no_model, 400, "model")  # two models served: `model` is required


def test_concurrent_requests_share_engine_batches(app):
    api, servers = app
    stats = servers["tiny"].engine.batcher.stats
    before = stats.batches
    responses = call(api, *[chat(max_tokens=16, messages=[{"role": "user", "content": f"count {i}"}])
                            for i in range(6)])
    assert all(r.status_code == 200 for r in responses)
    assert stats.batches - before < 6 and stats.max_batch_rows > 1


def test_a_small_stream_budget_merges_deltas_into_fewer_chunks(app):
    _, servers = app
    tiny = servers["tiny"]
    cfg = tiny.config.model_copy(update={"stream_messages_per_s": 0.01})  # 4 streams: one message per 400 s
    api = make_api({"tiny": LocalBackend(ModelServer(cfg, engine=tiny.engine))})
    asks = [[{"role": "user", "content": f"count {i}"}] for i in range(4)]
    streams = call(api, *[chat(max_tokens=64, messages=m, stream=True, temperature=0) for m in asks])
    plain = call(api, *[chat(max_tokens=64, messages=m, temperature=0) for m in asks])
    for stream, whole in zip(streams, plain):
        chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
        content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        assert len([c for c in content if c]) <= 3  # 64 tokens: the first at once, the rest merged
        assert "".join(c or "" for c in content) == whole.json()["choices"][0]["message"]["content"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_one_stream_under_the_budget_gets_its_deltas_as_they_come(app):
    """No fixed merge interval: one stream of 48 tokens under a GPU-sized budget arrives in several chunks,
    whose text, finish reason and usage are exactly the non-streamed answer's."""
    _, servers = app
    tiny = servers["tiny"]
    cfg = tiny.config.model_copy(update={"stream_messages_per_s": 3000.0})
    api = make_api({"tiny": LocalBackend(ModelServer(cfg, engine=tiny.engine))})
    ask = [{"role": "user", "content": "count to ten"}]
    stream, whole = call(api, chat(max_tokens=48, messages=ask, ignore_eos=True, stream=True, temperature=0,
                              stream_options={"include_usage": True}),
                         chat(max_tokens=48, messages=ask, ignore_eos=True, temperature=0))
    chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([c for c in content if c]) > 1
    assert "".join(c or "" for c in content) == whole.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == whole.json()["usage"] and chunks[-1]["usage"]["completion_tokens"] == 48
    assert stream.headers["x-fleetllm-replica"] == whole.headers["x-fleetllm-replica"] == "local"


def test_a_stream_trace_records_every_delta_once_in_order(app, tmp_path, monkeypatch):
    """FLEETLLM_STREAM_TRACE (fleetllm.serve.stream_trace): one line per stream, a timestamp per delta at the
    engine and at the serving loop, each message's time and delta count; the report reads them back."""
    from bench_modules import benchmark_module

    from fleetllm.serve import stream_trace

    report = benchmark_module("stream_trace_report")

    monkeypatch.setattr(stream_trace, "TRACE_DIR", str(tmp_path))
    _, servers = app
    tiny = servers["tiny"]
    cfg = tiny.config.model_copy(update={"stream_messages_per_s": 3000.0})
    api = make_api({"tiny": LocalBackend(ModelServer(cfg, engine=tiny.engine))})
    asks = [[{"role": "user", "content": f"count {i}"}] for i in range(3)]
    call(api, *[chat(max_tokens=24, messages=m, ignore_eos=True, stream=True, temperature=0) for m in asks])
    streams = report.load(tmp_path)
    assert len(streams) == 3
    for s in streams:
        assert len(s["engine"]) == len(s["loop"]) >= 24 and sum(n for _, n in s["out"]) == len(s["loop"])
        assert all(0 <= e <= lp for e, lp in zip(s["engine"], s["loop"]))  # the engine stamped it first
        assert s["loop"] == sorted(s["loop"]) and s["loop"][-1] <= s["out"][-1][0]
    row = report.summarize(streams)
    assert row["streams"] == 3 and row["deltas"] >= 72 and row["engine_to_loop_p99_ms"] >= 0


def test_chat_template_kwargs_reach_the_template(app):
    api, _ = app
    plain, loud = call(api, chat(model="themed", max_tokens=1),
                       chat(model="themed", max_tokens=1, chat_template_kwargs={"shout": True}))
    assert loud.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


def test_metrics_and_health_503_when_an_engine_is_dead(app):
    api, servers = app
    metrics, health = call(api, ("GET", "/metrics", {}), ("GET", "/health", {}))
    assert health.status_code == 200
    assert 'fleetllm_requests_total{endpoint="chat",model="tiny",status="200"}' in metrics.text
    assert 'fleetllm_requests_total{endpoint="chat",model="unknown",status="401"}' in metrics.text
    assert "fleetllm_time_to_first_token_seconds_bucket" in metrics.text
    # vLLM's names beside them (one replica in process, no Ray: its own snapshot), per served model id
    assert re.search(r'^vllm:request_success_total\{finished_reason="\w+",model_name="tiny"\} [1-9]', metrics.text, re.M)
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="tiny"}' in metrics.text
    servers["themed"].engine.stop()  # the themed engine dies
    health, still = call(api, ("GET", "/health", {}), chat(max_tokens=2))
    assert health.status_code == 503 and health.json()["models"] == ["themed"]
    assert still.status_code == 200  # the other model keeps serving
    (dead,) = call(api, chat(model="themed", max_tokens=2))
    assert_openai_error(dead, 503)


def test_logprobs_are_the_models_raw_ones_before_temperature_and_top_k(app):
    """As vLLM and OpenAI give them: sampling settings never change a step's logprobs, and a token top_k rules
    out is a number, never -inf (null in JSON); streamed, not streamed and the batch path agree."""
    import math

    from fleetllm.engines.base import GenerationRequest

    api, servers = app
    ask = dict(max_tokens=1, logprobs=True, top_logprobs=5)
    greedy, sampled, streamed = call(api, chat(**ask, temperature=0), chat(**ask, temperature=1.7, top_k=2, seed=3),
                                     chat(**ask, temperature=1.7, top_k=2, seed=3, stream=True))

    def first(entries):
        return {t["token"]: t["logprob"] for t in entries[0]["top_logprobs"]}

    raw = first(greedy.json()["choices"][0]["logprobs"]["content"])
    got = first(sampled.json()["choices"][0]["logprobs"]["content"])
    chunk = next(json.loads(line[6:]) for line in streamed.text.splitlines()
                 if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("logprobs"))
    live = first(chunk["choices"][0]["logprobs"]["content"])
    (batch,) = servers["tiny"].engine.generate([GenerationRequest(messages=MSG, sampling={
        "max_tokens": 1, "temperature": 1.7, "top_k": 2, "seed": 3, "logprobs": 5})])
    offline = {t["token"]: t["logprob"] for t in batch.completions[0].logprobs[0]["top_logprobs"]}
    assert len(raw) == 5 and all(isinstance(v, float) and math.isfinite(v) for v in raw.values())
    for other in (got, live, offline):  # top_k=2 would have left 3 of the 5 at -inf, temperature changed the rest
        assert other.keys() == raw.keys() and all(abs(other[k] - raw[k]) < 1e-4 for k in raw), (other, raw)


def test_a_logprob_of_minus_infinity_is_clamped_as_openai_does():
    import torch

    from fleetllm.engines.transformers_logits import LOGPROB_FLOOR, logprob_entry

    class Tok:
        def decode(self, ids):
            return f"<{ids[0]}>"

    logp = torch.tensor([0.0, float("-inf"), float("-inf")])
    entry = logprob_entry(Tok(), torch, logp, 1, 3)
    assert entry["logprob"] == LOGPROB_FLOOR == -9999.0
    assert [t["logprob"] for t in entry["top_logprobs"]] == [0.0, -9999.0, -9999.0]
    assert json.dumps(entry).count("Infinity") == 0


def test_under_gap_p99_a_streamed_interactive_request_steers_the_batch_window_by_its_gaps(app, monkeypatch):
    """FLEETLLM_BATCH_ADMISSION_SIGNAL=gap_p99: a streamed request's chunk gaps, not its mean per token, join the
    pool whose 99th percentile steers the batch window; a request that is not streamed gives none."""
    _, servers = app
    monkeypatch.setenv("FLEETLLM_BATCH_ADMISSION_SIGNAL", "gap_p99")
    tiny = servers["tiny"]
    cfg = LLMConfig(model_loading_config=dict(model_id="tiny", model_source=tiny.config.model_loading_config
                                              .model_source), engine="transformers", stream_messages_per_s=1e6)
    api = make_api({"tiny": LocalBackend(ModelServer(cfg, engine=tiny.engine), max_ongoing_requests=8,
                                         max_queued_requests=0)}, api_key=KEY)
    (plain,) = call(api, chat(max_tokens=16, ignore_eos=True))
    assert plain.status_code == 200, plain.text
    gate = api.state.admissions["tiny"]
    assert not gate.gaps and gate.window.smoothed_latency is None  # not streamed: no gaps, no sample
    (streamed,) = call(api, chat(max_tokens=16, ignore_eos=True, stream=True))
    assert streamed.status_code == 200, streamed.text
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    texts = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    messages = [t for t in texts[1:] if t is not None]  # after the role chunk: one chunk per engine message
    assert len(messages) >= 8  # 16 tokens; the engine may hand two at once when they come close together
    assert len(gate.gaps) == len(messages) - 1 and all(g >= 0 for g in gate.gaps)  # one per message after the first
    assert 0 < sum(gate.gaps) < streamed.elapsed.total_seconds()
