"""`fleetllm serve` as a subprocess serving both embedded models (the chat model as `smollm2`, the embedding
model as `minilm`, as examples/serve.yaml does), driven by the official openai client; then `ai_query` and a
`fleetllm query`-style job (engine openai, task embed) against its /v1/embeddings."""

from __future__ import annotations

import json
import math

import openai
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from fleetllm.testing.serve_process import ServeProcess

PARAPHRASE = ("A man is eating food.", "A man eats a meal.", "The stock market fell sharply today.")


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_model, embedding_model):
    common = {"engine": "transformers", "max_ongoing_requests": 8, "max_queued_requests": 8, "cpus_per_replica": 0.5}
    spec = {"name": "e2e-embed", "models": [
        {"model_id": "smollm2", "source": "smollm2-135m-instruct", "engine_kwargs": {"max_model_len": 2048}, **common},
        {"model_id": "minilm", "source": "all-minilm-l6-v2", **common}]}
    proc = ServeProcess(spec, tmp_path_factory.mktemp("serve-embed"))
    proc.start()
    yield proc
    proc.stop()


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_openai_client_embeddings_rank_a_paraphrase_first(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    floats = client.embeddings.create(model="minilm", input=list(PARAPHRASE), encoding_format="float")
    vecs = [d.embedding for d in floats.data]
    assert [len(v) for v in vecs] == [384, 384, 384] and floats.model == "minilm"
    assert cosine(vecs[0], vecs[1]) > cosine(vecs[0], vecs[2]) + 0.5
    assert floats.usage.prompt_tokens > 6 and floats.usage.total_tokens == floats.usage.prompt_tokens
    # the client's default asks for base64 and decodes it: the same vectors
    default = client.embeddings.create(model="minilm", input=list(PARAPHRASE))
    assert all(max(abs(x - y) for x, y in zip(d.embedding, v)) < 1e-6 for d, v in zip(default.data, vecs))
    raw = client.embeddings.with_raw_response.create(model="minilm", input="hi", encoding_format="base64")
    assert isinstance(json.loads(raw.http_response.text)["data"][0]["embedding"], str)
    # the chat model still chats in the same server
    chat = client.chat.completions.create(model="smollm2", max_tokens=16, temperature=0,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content


def test_each_model_refuses_the_other_endpoint(served):
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="generative model"):
        client.embeddings.create(model="smollm2", input="hi")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="minilm", input="hi", dimensions=64)


def test_ai_query_and_a_query_job_embed_through_the_endpoint(served, ray_local, tmp_path):
    import ray

    import fleetllm
    from fleetllm.batch.runner import run_job
    from fleetllm.spec import JobSpec

    ds = ray.data.from_items([{"text": t} for t in PARAPHRASE] + [{"text": ""}])
    rows = fleetllm.ai_query(ds, "minilm", prompt_col="text", task="embed", base_url=served.url,
                             output_col="emb", concurrency=1).take_all()
    by_text = {r["text"]: r["emb"] for r in rows}
    assert all(by_text[t]["error"] is None and len(by_text[t]["embedding"]) == 384 for t in PARAPHRASE)
    assert "empty" in by_text[""]["error"]
    a, b, c = (by_text[t]["embedding"] for t in PARAPHRASE)
    assert cosine(a, b) > cosine(a, c)

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(PARAPHRASE)))
    spec = JobSpec.model_validate({
        "task": "embed", "model": {"source": "minilm", "engine": "openai", "engine_kwargs": {"base_url": served.url}},
        "input": {"path": str(src), "id_column": "id"}, "output": {"path": str(tmp_path / "out")}})
    report = run_job(spec)
    table = pads.dataset(spec.output.path, format="parquet", exclude_invalid_files=True).to_table()
    assert report["errors"] == 0 and table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    got = {r["row_id"]: r["embedding"] for r in table.to_pylist()}
    assert cosine(got["0"], got["1"]) > cosine(got["0"], got["2"])
