"""`task: embed` batch jobs on a local Ray cluster with the embedded all-MiniLM-L6-v2 (transformers engine):
an `embedding` fixed-size list<float32>[384] column, per-row errors kept, OpenAI Batch embeddings files."""

import base64
import json
import math
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import InputError, PlanError
from fleetllm.spec import JobSpec

TEXTS = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today.", "", "word " * 400]


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def spec_for(model, tmp_path, **over) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "sentence": t}) + "\n" for i, t in enumerate(TEXTS)))
    data = {"name": "emb", "task": "embed", "model": {"source": model, "engine": "transformers"},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{sentence}"},
            "output": {"path": str(tmp_path / "out"), "shard_rows": 2}, "compute": {"replicas": 1}, **over}
    return JobSpec.model_validate(data)


def test_embed_job_writes_a_fixed_size_embedding_column(ray_local, embedding_model, tmp_path):
    spec = spec_for("all-minilm-l6-v2", tmp_path)
    report = run_job(spec)
    table = pads.dataset(spec.output.path, format="parquet", exclude_invalid_files=True).to_table()
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert "generated_text" not in table.column_names and "num_generated_tokens" not in table.column_names
    rows = {r["row_id"]: r for r in table.to_pylist()}
    assert sorted(rows) == [f"r{i}" for i in range(5)] and report["rows"] == 5 and report["errors"] == 2
    v = [rows[f"r{i}"]["embedding"] for i in range(3)]
    assert cosine(v[0], v[1]) > 0.8 > cosine(v[0], v[2])
    assert all(rows[f"r{i}"]["error"] is None and rows[f"r{i}"]["num_input_tokens"] > 3 for i in range(3))
    assert "empty" in rows["r3"]["error"] and rows["r3"]["embedding"] is None
    assert "256" in rows["r4"]["error"] and rows["r4"]["embedding"] is None
    again = run_job(spec)
    assert again["rows_skipped"] == 5 and again["rows_computed"] == 0


def test_embed_job_is_checked_before_it_runs(embedding_model, tmp_path):
    with pytest.raises(ValueError, match="sampling"):
        spec_for("all-minilm-l6-v2", tmp_path, sampling={"max_tokens": 4})
    spec = spec_for("all-minilm-l6-v2", tmp_path, task="generate")
    from fleetllm.batch.planning.job_plan import plan_job

    with pytest.raises(PlanError, match="embedding model.*task: embed"):
        plan_job(spec)
    bare = spec_for("all-minilm-l6-v2", tmp_path, prompt={})
    with pytest.raises(InputError, match="`text` or `prompt` column"):
        plan_job(bare)


def batch_line(i, url, body):
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}) + "\n"


def test_openai_batch_embeddings_file(ray_local, embedding_model, tmp_path):
    src = tmp_path / "batch.jsonl"
    src.write_text(
        batch_line(0, "/v1/embeddings", {"model": "m", "input": "A man is eating food."})
        + batch_line(1, "/v1/embeddings", {"model": "m", "input": ["A man eats a meal.", "Stocks fell."],
                                           "encoding_format": "base64"})
        + batch_line(2, "/v1/embeddings", {"model": "m", "input": "hi", "dimensions": 64})
        + batch_line(3, "/v1/embeddings", {"model": "m", "input": "hi", "truncate": True}))
    spec = JobSpec.model_validate({
        "model": {"source": "all-minilm-l6-v2", "engine": "transformers"},
        "input": {"path": str(src), "format": "openai_batch"},
        "output": {"path": str(tmp_path / "out"), "format": "openai_batch", "shard_rows": 2}})
    run_job(spec)
    out = [json.loads(x) for x in (Path(spec.output.path) / "output.jsonl").read_text().splitlines()]
    errors = [json.loads(x) for x in (Path(spec.output.path) / "errors.jsonl").read_text().splitlines()]
    assert sorted(x["custom_id"] for x in out) == ["c0", "c1"] and sorted(x["custom_id"] for x in errors) == ["c2", "c3"]
    by_id = {x["custom_id"]: x["response"]["body"] for x in out}
    assert by_id["c0"]["object"] == "list" and len(by_id["c0"]["data"][0]["embedding"]) == 384
    assert by_id["c0"]["usage"]["prompt_tokens"] > 3
    decoded = [struct.unpack("<384f", base64.b64decode(d["embedding"])) for d in by_id["c1"]["data"]]
    assert [d["index"] for d in by_id["c1"]["data"]] == [0, 1]
    assert cosine(by_id["c0"]["data"][0]["embedding"], decoded[0]) > cosine(by_id["c0"]["data"][0]["embedding"],
                                                                             decoded[1])
    why = {x["custom_id"]: x["error"]["message"] for x in errors}
    assert "dimensions" in why["c2"] and "truncate" in why["c3"]


def test_a_file_mixing_embeddings_and_chat_lines_is_refused(embedding_model, tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_text(batch_line(0, "/v1/embeddings", {"input": "x"})
                   + batch_line(1, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}))
    spec = JobSpec.model_validate({
        "model": {"source": "all-minilm-l6-v2", "engine": "transformers"},
        "input": {"path": str(src), "format": "openai_batch"},
        "output": {"path": str(tmp_path / "out"), "format": "openai_batch"}})
    from fleetllm.batch.planning.job_plan import plan_job

    with pytest.raises(InputError, match="mixes embeddings and generation lines.*line 1.*line 2"):
        plan_job(spec)
