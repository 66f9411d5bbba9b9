"""OpenAIHTTPEngine against the real capacity-limited server: order, attempts, errors, window persistence."""

from __future__ import annotations

import pytest

from fleetllm.engines.base import GenerationRequest, create_engine
from fleetllm.errors import EndpointError, SpecError
from fleetllm.testing.capacity_server import CapacityServer


@pytest.fixture(scope="module")
def server():
    with CapacityServer(capacity=4, latency_s=0.002) as srv:
        yield srv


def make_engine(base_url: str, **kw):
    engine = create_engine("openai", "capacity-test", engine_kwargs={"base_url": base_url, **kw})
    engine.start()
    return engine


def test_generate_in_order_with_chat_and_prompt_rows(server):
    # no latency signal: a CPU stall of a loaded test machine would otherwise cut the window mid-test
    engine = make_engine(server.base_url, aimd={"initial_window": 2, "use_latency": False})
    try:
        reqs = [GenerationRequest(messages=[{"role": "user", "content": f"m {i}"}], sampling={"max_tokens": 8})
                for i in range(30)]
        reqs.append(GenerationRequest(prompt="a b c d", sampling={"max_tokens": 2}))
        results = engine.generate(reqs)
        assert [r.text for r in results[:30]] == [f"echo: m {i}" for i in range(30)]
        assert results[30].text == "echo: a" and results[30].completions[0].finish_reason == "length"
        assert all(r.error is None and r.attempts == 1 for r in results)
        assert results[0].num_input_tokens == 2 and results[0].num_generated_tokens == 3
        # the window persists across generate calls on the same engine
        controller = engine.controller
        grown = controller.window
        assert grown > 2.0
        engine.generate(reqs[:5])
        assert engine.controller is controller and controller.stats.sent == 36 and controller.window >= grown
    finally:
        engine.stop()


def test_failed_rows_keep_their_error_and_a_missing_model_stops(server):
    engine = make_engine(server.base_url)
    try:
        sent = server.stats()["requests"]
        results = engine.generate([GenerationRequest(prompt="x"), GenerationRequest(messages=[{"role": "user"}]),
                                   GenerationRequest(messages=[{"role": "user", "content": "a \udc00"}])])
        assert results[0].error is None and results[0].attempts == 1
        assert "content" in results[1].error  # a malformed row fails alone, before sending
        assert results[2].error.startswith("messages[0].content holds a lone UTF-16 surrogate U+DC00 at character 2")
        assert not results[2].attempts and server.stats()["requests"] == sent + 1  # refused here, never sent
    finally:
        engine.stop()
    engine = make_engine(server.base_url, model="missing-model")
    try:  # a 404 for the model is not the row's fault: never a row's result (fleetllm.errors.EndpointError)
        with pytest.raises(EndpointError, match="does not serve model 'missing-model' \\(HTTP 404"):
            engine.generate([GenerationRequest(prompt="x")])
    finally:
        engine.stop()


def test_thirty_percent_503_yields_every_row_with_attempts_counted():
    with CapacityServer(capacity=8, latency_s=0.001, failure_rate=0.3, seed=7) as srv:
        engine = make_engine(srv.base_url, max_retries=12, retry={"initial_backoff_s": 0.002, "max_backoff_s": 0.02})
        try:
            results = engine.generate([GenerationRequest(prompt=f"p {i}") for i in range(120)])
        finally:
            engine.stop()
        stats = srv.stats()
    assert [r.text for r in results] == [f"echo: p {i}" for i in range(120)]
    assert all(r.error is None for r in results)
    assert sum(r.attempts for r in results) == stats["requests"]  # every attempt counted
    assert [r.attempts for r in results] == [stats["prompts"][f"p {i}"] for i in range(120)]
    assert stats["failed"] > 10 and any(r.attempts > 1 for r in results)


def test_engine_kwargs_are_checked():
    engine = create_engine("openai", "m", engine_kwargs={"base_url": "http://127.0.0.1:1/v1", "max_retry": 3})
    with pytest.raises(SpecError, match="max_retry: unknown field"):
        engine.start()


def test_the_endpoint_and_key_come_from_openai_base_url_and_openai_api_key(monkeypatch):
    """As the openai client reads them: a job spec without engine_kwargs.base_url takes $OPENAI_BASE_URL (on the
    driver, into the spec the replicas get), the engine sends $OPENAI_API_KEY."""
    from fleetllm.spec import JobSpec

    with CapacityServer(capacity=2, latency_s=0.001, api_key="sk-env") as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        spec = JobSpec.model_validate({"input": {"path": "in.jsonl"}, "output": {"path": "out"},
                                       "model": {"engine": "openai", "source": "capacity-test"}})
        assert spec.model.engine_kwargs["base_url"] == srv.base_url
        engine = create_engine("openai", "capacity-test", engine_kwargs={})
        engine.start()
        try:
            (ok,) = engine.generate([GenerationRequest(prompt="hi")])
        finally:
            engine.stop()
        assert ok.error is None and ok.text == "echo: hi"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        engine = create_engine("openai", "capacity-test", engine_kwargs={})
        engine.start()
        try:
            with pytest.raises(EndpointError, match="refused the api key"):
                engine.generate([GenerationRequest(prompt="hi")])
        finally:
            engine.stop()
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(SpecError, match=r"base_url is missing: set engine_kwargs.base_url .* or \$OPENAI_BASE_URL"):
        create_engine("openai", "capacity-test", engine_kwargs={}).start()
