"""POST /v1/embeddings in-process (FastAPI through httpx's ASGITransport) over the real transformers
embedding engine on the embedded all-MiniLM-L6-v2, beside a chat model: the OpenAI shape (string, list,
token ids; float and base64), usage, and the 400s (wrong task both ways, dimensions, unknown fields)."""

from __future__ import annotations

import asyncio
import base64
import math
import struct

import httpx
import pytest

from fleetllm.engines.base import create_engine
from fleetllm.serve.api import make_api
from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.serve.spec import LLMConfig


@pytest.fixture(scope="module")
def app(tiny_model, embedding_model):
    servers = {}
    for model_id, path, task in (("chat", tiny_model, "generate"), ("minilm", embedding_model, "embed")):
        engine = create_engine("transformers", path, task=task, engine_kwargs={})
        engine.start()
        cfg = LLMConfig(model_loading_config=dict(model_id=model_id, model_source=path), engine="transformers")
        servers[model_id] = ModelServer(cfg, engine=engine)
    assert servers["minilm"].task == "embed" and servers["chat"].task == "generate"
    yield make_api({m: LocalBackend(s) for m, s in servers.items()})
    for s in servers.values():
        s.engine.stop()


def post(app, path, body):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await client.post(path, json=body)
    return asyncio.run(go())


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_float_base64_and_token_ids_agree(app):
    texts = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today."]
    r = post(app, "/v1/embeddings", {"model": "minilm", "input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and all(d["object"] == "embedding" for d in body["data"])
    vecs = [d["embedding"] for d in body["data"]]
    assert all(len(v) == 384 for v in vecs)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vecs)  # the folder's Normalize module
    assert cosine(vecs[0], vecs[1]) > 0.8 > cosine(vecs[0], vecs[2])
    assert body["usage"]["prompt_tokens"] > 3 * 2 and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]
    # base64: little-endian float32, the same vectors
    b = post(app, "/v1/embeddings", {"model": "minilm", "input": texts, "encoding_format": "base64"}).json()
    decoded = [list(struct.unpack("<384f", base64.b64decode(d["embedding"]))) for d in b["data"]]
    assert all(max(abs(x - y) for x, y in zip(u, v)) < 1e-6 for u, v in zip(decoded, vecs))
    # one string; and the same text as token ids ([CLS] ... [SEP], as the tokenizer gives them)
    one = post(app, "/v1/embeddings", {"model": "minilm", "input": texts[0]}).json()
    assert max(abs(x - y) for x, y in zip(one["data"][0]["embedding"], vecs[0])) < 1e-5
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(app.state.backends["minilm"].server.engine.model_path)(texts[0])["input_ids"]
    by_ids = post(app, "/v1/embeddings", {"model": "minilm", "input": ids}).json()
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    assert max(abs(x - y) for x, y in zip(by_ids["data"][0]["embedding"], vecs[0])) < 1e-5
    many = post(app, "/v1/embeddings", {"model": "minilm", "input": [ids, ids]}).json()
    assert len(many["data"]) == 2


def error(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_each_model_refuses_the_other_task(app):
    err = error(post(app, "/v1/chat/completions", {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}),
                400)
    assert "embedding model" in err["message"] and err["param"] == "model"
    err = error(post(app, "/v1/completions", {"model": "minilm", "prompt": "hi"}), 400)
    assert "/v1/completions" in err["message"]
    err = error(post(app, "/v1/embeddings", {"model": "chat", "input": "hi"}), 400)
    assert "generative model" in err["message"] and "/v1/embeddings" in err["message"]


def test_bad_embedding_requests_get_a_400_naming_the_problem(app):
    err = error(post(app, "/v1/embeddings", {"model": "minilm", "input": "hi", "dimensions": 128}), 400)
    assert err["param"] == "dimensions" and "Matryoshka" in err["message"]
    ok = post(app, "/v1/embeddings", {"model": "minilm", "input": "hi", "dimensions": 384})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384
    err = error(post(app, "/v1/embeddings", {"model": "minilm", "input": "hi", "truncate": True}), 400)
    assert err["param"] == "truncate"
    err = error(post(app, "/v1/embeddings", {"model": "minilm", "input": "hi", "encoding_format": "int8"}), 400)
    assert err["param"] == "encoding_format"
    error(post(app, "/v1/embeddings", {"model": "minilm", "input": []}), 400)
    err = error(post(app, "/v1/embeddings", {"model": "minilm", "input": ["fine", "word " * 400]}), 400)
    assert "input[1]" in err["message"] and "256" in err["message"]
    error(post(app, "/v1/embeddings", {"model": "nope", "input": "hi"}), 404)
