"""Embeddings on the vLLM engine (vllm-cpu here; its pooling runner) with the embedded all-MiniLM-L6-v2:
`fleetllm serve` under the official openai client, and `fleetllm run` on a `task: embed` job and on an OpenAI
Batch embeddings file. The vectors match the transformers engine's (sentence-transformers)."""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import struct

import openai
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import yaml

from fleetllm.testing.serve_process import ServeProcess
from test_cli_run import fleetllm

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(900),
]

PARAPHRASE = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today."]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def reference(embedding_model):
    """The transformers engine's vectors of PARAPHRASE (sentence-transformers pooling)."""
    from fleetllm.engines.base import EmbeddingRequest, create_engine

    engine = create_engine("transformers", embedding_model, task="embed", engine_kwargs={})
    engine.start()
    try:
        return [r.embedding for r in engine.embed([EmbeddingRequest(text=t) for t in PARAPHRASE])]
    finally:
        engine.stop()


def test_serve_embeddings_on_vllm(tmp_path, embedding_model, embedded_model, reference):
    spec = {"name": "vllm-embed", "models": [
        {"model_id": "minilm", "source": "all-minilm-l6-v2", "engine": "vllm", "cpus_per_replica": 1,
         "max_ongoing_requests": 8, "max_queued_requests": 8},
        {"model_id": "smollm2", "source": "smollm2-135m-instruct", "engine": "transformers", "cpus_per_replica": 0.5,
         "engine_kwargs": {"max_model_len": 2048}, "max_ongoing_requests": 8, "max_queued_requests": 8}]}
    with ServeProcess(spec, tmp_path, env=ENV, start_timeout_s=700) as served:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
        out = client.embeddings.create(model="minilm", input=PARAPHRASE, encoding_format="float")
        vecs = [d.embedding for d in out.data]
        assert [len(v) for v in vecs] == [384] * 3 and out.usage.prompt_tokens > 6
        assert cosine(vecs[0], vecs[1]) > cosine(vecs[0], vecs[2]) + 0.5
        assert all(cosine(v, r) > 0.999 for v, r in zip(vecs, reference))  # the same model as sentence-transformers
        default = client.embeddings.create(model="minilm", input=PARAPHRASE)  # base64 on the wire, decoded
        assert all(max(abs(x - y) for x, y in zip(d.embedding, v)) < 1e-6 for d, v in zip(default.data, vecs))
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model="minilm", input="hi", dimensions=64)
        with pytest.raises(openai.BadRequestError, match="256"):
            client.embeddings.create(model="minilm", input="word " * 400)


def test_fleetllm_run_embed_job_on_vllm(tmp_path, embedding_model, reference):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n"
                                               for i, t in enumerate(PARAPHRASE + [""])))
    job = {"name": "embed-vllm", "task": "embed", "model": {"source": "all-minilm-l6-v2", "engine": "vllm"},
           "input": {"path": str(tmp_path / "in.jsonl"), "id_column": "id"},
           "output": {"path": str(tmp_path / "out"), "shard_rows": 2}, "compute": {"cpus_per_replica": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = fleetllm("run", str(tmp_path / "job.yaml"), "--max-error-rate", "0.5", timeout=850, env={**__import__("os").environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pads.dataset(str(tmp_path / "out"), format="parquet", exclude_invalid_files=True).to_table()
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    rows = {r["row_id"]: r for r in table.to_pylist()}
    assert all(cosine(rows[f"r{i}"]["embedding"], reference[i]) > 0.999 for i in range(3))
    assert "empty" in rows["r3"]["error"] and rows["r3"]["embedding"] is None
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["engine"]["name"] == "vllm" and report["rows"] == 4 and report["errors"] == 1


def test_openai_batch_embeddings_file_on_vllm(tmp_path, embedding_model, reference):
    lines = [{"custom_id": "one", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": PARAPHRASE[0]}},
             {"custom_id": "two", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "m", "input": PARAPHRASE[1:], "encoding_format": "base64"}},
             {"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "hi",
                                                                                        "dimensions": 8}}]
    (tmp_path / "batch.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    job = {"model": {"source": "all-minilm-l6-v2", "engine": "vllm"},
           "input": {"path": str(tmp_path / "batch.jsonl"), "format": "openai_batch"},
           "output": {"path": str(tmp_path / "out"), "format": "openai_batch"}, "compute": {"cpus_per_replica": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = fleetllm("run", str(tmp_path / "job.yaml"), "--max-error-rate", "0.5", timeout=850, env={**__import__("os").environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "out" / "output.jsonl").read_text().splitlines())}
    errors = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert sorted(out) == ["one", "two"] and [e["custom_id"] for e in errors] == ["bad"]
    assert "dimensions" in errors[0]["error"]["message"]
    assert cosine(out["one"]["response"]["body"]["data"][0]["embedding"], reference[0]) > 0.999
    two = [struct.unpack("<384f", base64.b64decode(d["embedding"])) for d in out["two"]["response"]["body"]["data"]]
    assert all(cosine(v, r) > 0.999 for v, r in zip(two, reference[1:]))
