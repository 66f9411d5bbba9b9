"""`fleetllm serve` as a subprocess on the embedded SmolLM2 model, driven by the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from fleetllm.testing.serve_process import ServeProcess


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_model):
    spec = {"name": "e2e", "models": [{"model_id": "smollm2", "source": "smollm2-135m-instruct",
                                       "engine": "transformers", "engine_kwargs": {"max_model_len": 2048},
                                       "max_ongoing_requests": 8, "max_queued_requests": 8}]}
    proc = ServeProcess(spec, tmp_path_factory.mktemp("serve"))
    proc.start()
    yield proc
    proc.stop()


def test_chat_answers_paris_and_streams_the_same(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0)
    assert "Paris" in chat.choices[0].message.content
    assert chat.choices[0].finish_reason == "stop" and chat.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, stream=True, temperature=0,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_model_may_be_omitted_when_one_model_is_served(served):
    r = httpx.post(f"{served.url}/chat/completions", timeout=300,
                   json={"messages": [{"role": "user", "content": "What is the capital of France?"}],
                         "max_tokens": 16, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and r.json()["model"] == "smollm2" and "Paris" in r.text


def test_the_model_replica_itself_listens_on_the_apps_port(served):
    import psutil

    # http: auto on one replica and a Ray started by `fleetllm serve`: the replica, not Serve's proxy, listens
    assert "http: replica: the model replica listens on the app's address itself" in served.log()
    (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
              and c.laddr.port == served.port}
    assert psutil.Process(pid).name().startswith("ray::ServeRepli"), psutil.Process(pid).cmdline()


def test_sigterm_shuts_down_cleanly(served):
    assert served.stop() == 0
    assert "shutting down" in served.log()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{served.url}/models", timeout=2)
