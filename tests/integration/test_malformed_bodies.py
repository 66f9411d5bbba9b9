"""Malformed request bodies against the OpenAI API in-process (FastAPI over the real transformers
engine on a tiny random model): each is a 400 in OpenAI's error shape, never a plain-text 500, and
the server answers the next normal request."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fleetllm.engines.transformers_engine import TransformersEngine
from fleetllm.serve.api import make_api
from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.serve.spec import LLMConfig

OK = {"model": "tiny", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def app(tiny_model):
    engine = TransformersEngine(tiny_model, engine_kwargs={"max_model_len": 256})
    engine.start()
    cfg = LLMConfig(model_loading_config=dict(model_id="tiny", model_source=tiny_model), engine="transformers")
    yield make_api({"tiny": LocalBackend(ModelServer(cfg, engine=engine))})
    engine.stop()


def post(app, path: str, *, body: bytes | None = None, json=None) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            if body is not None:
                return await client.post(path, content=body, headers={"content-type": "application/json"})
            return await client.post(path, json=json)
    return asyncio.run(go())


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


DEEP = "too deeply"
BODIES = [  # (path, raw body, words the message holds)
    ("/v1/chat/completions", nested(100_000), DEEP),
    ("/v1/completions", '{"model": "tiny", "prompt": ' + nested(100_000) + "}", DEEP),
    ("/v1/embeddings", '{"model": "tiny", "input": ' + nested(100_000) + "}", DEEP),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": '
     + nested(950) + "}", ""),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
     '"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": '
     + '{"type": "array", "items": ' * 900 + '{"type": "string"}' + "}" * 900 + "}}}", ""),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": ' + nested(950) + "}]}", ""),
]


@pytest.mark.parametrize("path, body, words", BODIES, ids=range(len(BODIES)))
def test_a_malformed_body_is_an_openai_shaped_400(app, path, body, words):
    r = post(app, path, body=body.encode())
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert words in error["message"]
    assert post(app, "/v1/chat/completions", json=OK).status_code == 200


@pytest.mark.parametrize("message, index", [
    ({"role": "user"}, 0),
    ({"role": "user", "content": None}, 0),
    ({"role": "system"}, 0),
    ({"role": "assistant"}, 1),
])
def test_a_message_without_content_is_refused_as_openai_does(app, message, index):
    messages = [message] if index == 0 else [{"role": "user", "content": "hi"}, message]
    r = post(app, "/v1/chat/completions", json={**OK, "messages": messages})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == f"messages[{index}].content"
    assert error["code"] == "missing_required_parameter"
    assert error["message"].startswith(f"Missing required parameter: 'messages[{index}].content'")


def test_an_empty_content_string_is_still_served(app):
    r = post(app, "/v1/chat/completions", json={**OK, "messages": [{"role": "user", "content": ""}]})
    assert r.status_code == 200, r.text
