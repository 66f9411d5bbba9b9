"""compute.prefix_grouping on a real job (the transformers engine, a tiny random-weight model, in this
process): each row once with its own id and answer, the grouped plan resumed exactly, the setting in the
fingerprint, and the run record's prefix-cache fields where the engine does not report cache hits."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec

DOCS, QUESTIONS = 10, 3


def read_output(path) -> dict[str, dict]:
    rows = pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    by_id = {r["row_id"]: r for r in rows}
    assert len(by_id) == len(rows)  # no row twice
    return by_id


def make_spec(tiny_model, tmp_path, out: str, grouping: str) -> JobSpec:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        rng = random.Random(1)
        docs = [f"Document {d}: " + " ".join(rng.choice(["red", "green", "blue"]) for _ in range(60))
                for d in range(DOCS)]
        rows = [{"id": f"d{d}q{q}", "doc": docs[d], "question": f"Question {q} about document {d}?"}
                for d in range(DOCS) for q in range(QUESTIONS)]
        rng.shuffle(rows)
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return JobSpec.model_validate({
        "name": "prefix", "model": {"source": tiny_model, "engine": "transformers"},
        "input": {"path": str(src), "id_column": "id"},
        "prompt": {"system": "Answer briefly.", "template": "{doc}\n\n{question}"},
        "sampling": {"max_tokens": 3}, "output": {"path": str(tmp_path / out), "shard_rows": 8},
        "compute": {"replicas": 1, "batch_size": 4, "prefix_grouping": grouping},
    })


def test_grouped_job_keeps_each_rows_id_and_answer_and_resumes_exactly(tiny_model, tmp_path):
    on = make_spec(tiny_model, tmp_path, "on", "on")
    report = run_job(on)
    grouped = read_output(on.output.path)
    ids = {f"d{d}q{q}" for d in range(DOCS) for q in range(QUESTIONS)}
    assert set(grouped) == ids
    for rid, row in grouped.items():  # the row's own input beside its answer
        assert row["question"].startswith(f"Question {rid.split('q')[1]} about document {rid[1:].split('q')[0]}")
        assert row["error"] is None and row["num_generated_tokens"] > 0
    saved = json.loads((Path(on.output.path) / "_SUCCESS").read_text())
    assert saved["prefix_grouping"]["on"] and saved["complete"] and saved["rows"] == len(ids)
    assert saved["prompt_tokens"] == sum(r["num_input_tokens"] for r in grouped.values())
    assert saved["cached_prompt_tokens"] is None and saved["prefix_cache_hit_rate"] is None  # transformers
    # the rows of one document sit next to each other in the output (the grouped shards' order)
    order = [r["row_id"] for r in pads.dataset(on.output.path, format="parquet",
                                               exclude_invalid_files=True).to_table().to_pylist()]
    runs = [rid.split("q")[0] for k, rid in enumerate(order) if k == 0 or order[k - 1].split("q")[0] != rid.split("q")[0]]
    assert len(runs) <= DOCS + report["shards"]  # a document split at most at a shard's edge

    # the same rows, ungrouped: the same prompt and the same greedy answer for each row id
    run_job(make_spec(tiny_model, tmp_path, "off", "off"))
    off = read_output(tmp_path / "off")
    for rid in ids:
        assert grouped[rid]["num_input_tokens"] == off[rid]["num_input_tokens"]
        assert grouped[rid]["generated_text"] == off[rid]["generated_text"]

    # a partial run: two shards' commits lost; the next run reuses the grouped plan and computes only those
    commits = sorted((Path(on.output.path) / "_fleetllm" / "commits").iterdir())
    lost = [json.loads(p.read_text())["rows"] for p in commits[:2]]
    for p in commits[:2]:
        p.unlink()
    again = run_job(on)
    assert again["rows_computed"] == sum(lost) and again["shards_computed"] == 2
    assert read_output(on.output.path) == grouped

    with pytest.raises(PlanError, match="prefix_grouping"):  # the setting is part of the fingerprint
        run_job(make_spec(tiny_model, tmp_path, "on", "off"))


def test_grouped_job_on_ray_with_two_replicas_reads_the_grouped_shards(ray_local, tiny_model, tmp_path):
    spec = make_spec(tiny_model, tmp_path, "ray", "on")
    spec.compute.replicas = 2
    report = run_job(spec)
    assert not report["in_process"] and report["replicas"] == 2
    out = read_output(spec.output.path)
    assert set(out) == {f"d{d}q{q}" for d in range(DOCS) for q in range(QUESTIONS)}
    for rid, row in out.items():
        assert row["question"].startswith(f"Question {rid.split('q')[1]} about document {rid[1:].split('q')[0]}")
        assert row["error"] is None and row["num_generated_tokens"] > 0
    assert len(report["shard_nodes"]) == report["shards"]

    # replica affinity: each shard computed by one replica, every row of a document by the same replica,
    # and both replicas used (the grouped files are dealt to one lane per replica)
    replicas = report["shard_replicas"]
    assert set(replicas) == {str(s) for s in range(report["shards"])}
    assert all(len(r) == 1 for r in replicas.values())
    doc_replicas: dict[str, set] = {}
    for part in sorted(Path(spec.output.path).glob("part-*.parquet")):
        shard = str(int(part.stem.split("-")[1]))
        for rid in pads.dataset(str(part), format="parquet").to_table(columns=["row_id"]).column("row_id").to_pylist():
            doc_replicas.setdefault(rid.split("q")[0], set()).update(replicas[shard])
    assert len(doc_replicas) == DOCS and all(len(r) == 1 for r in doc_replicas.values()), doc_replicas
    assert len(set().union(*doc_replicas.values())) == 2
    assert report["prefix_grouping"]["replica_affinity"] is True


def test_a_timestamp_column_is_refused_by_on_and_keeps_auto_off(tiny_model, tmp_path):
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from fleetllm.batch.planning.job_plan import plan_job

    n = 300  # above auto's minimum; every row the same document (auto would group them)
    pq.write_table(pa.table({"doc": ["Document one. " * 40] * n, "question": [f"Q{i}?" for i in range(n)],
                             "at": [datetime.datetime(2026, 1, 1, 12, i % 60) for i in range(n)]}),
                   tmp_path / "in.parquet")

    def spec(grouping: str) -> JobSpec:
        return JobSpec.model_validate({
            "name": "typed", "model": {"source": tiny_model, "engine": "transformers"},
            "input": {"path": str(tmp_path / "in.parquet"), "format": "parquet"},
            "prompt": {"template": "{doc}\n\n{question}"}, "output": {"path": str(tmp_path / f"out-{grouping}")},
            "compute": {"replicas": 1, "prefix_grouping": grouping}})

    with pytest.raises(PlanError, match="'at'.*timestamp.*prefix_grouping: off"):
        plan_job(spec("on"))
    plan = plan_job(spec("auto"))
    assert not plan.grouped and "'at'" in plan.grouping.reason
    assert not (tmp_path / "out-auto").exists() and not (tmp_path / "out-on").exists()


def test_openai_batch_job_groups_its_lines_and_answers_each_custom_id_once(tiny_model, tmp_path):
    """The job a Batch API batch runs (openai_batch in and out), on the transformers engine: auto groups
    lines sharing a document, each custom_id answered once in OpenAI's shape, a document's lines run
    together, the same answers as ungrouped, and a resumed run computes only the lost shards."""
    from fleetllm.batch.planning.job_plan import plan_job
    from fleetllm.testing.batch_client import document_lines, jsonl

    docs, questions = 66, 4  # 264 lines: above auto's 256-row minimum
    lines = document_lines(docs, questions, max_tokens=2)
    (tmp_path / "batch.jsonl").write_bytes(jsonl(lines))

    def spec(out: str, grouping: str = "auto") -> JobSpec:
        return JobSpec.model_validate({
            "name": "batch", "model": {"source": tiny_model, "engine": "transformers"},
            "input": {"path": str(tmp_path / "batch.jsonl"), "format": "openai_batch"},
            "output": {"path": str(tmp_path / out), "format": "openai_batch", "shard_rows": 32},
            "compute": {"replicas": 1, "batch_size": 32, "prefix_grouping": grouping}})

    def answers(out: str) -> list[dict]:
        assert (tmp_path / out / "errors.jsonl").read_text() == ""
        return [json.loads(x) for x in (tmp_path / out / "output.jsonl").read_text().splitlines()]

    grouped = spec("grouped")
    plan = plan_job(grouped)
    assert plan.grouped and plan.grouping.reason.startswith("auto: "), plan.grouping.reason
    report = run_job(grouped)
    assert report["prefix_grouping"]["on"] and report["rows"] == len(lines)
    out = answers("grouped")
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)  # each once
    url = {x["custom_id"]: x["url"] for x in lines}
    for x in out:
        body = x["response"]["body"]
        assert x["response"]["status_code"] == 200 and body["usage"]["completion_tokens"] > 0
        if url[x["custom_id"]] == "/v1/chat/completions":
            assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
        else:
            assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str)
    # a document's lines ran together: output.jsonl follows the grouped shards, a document split at most at
    # a shard's edge (the input has them scattered: a run per line, nearly)
    order = [x["custom_id"].split("q")[0] for x in out]
    runs = [d for k, d in enumerate(order) if k == 0 or order[k - 1] != d]
    assert len(runs) <= docs + report["shards"]
    scattered = [x["custom_id"].split("q")[0] for x in lines]
    assert sum(k == 0 or scattered[k - 1] != d for k, d in enumerate(scattered)) > 3 * docs

    def texts(rows: list[dict]) -> dict[str, tuple]:
        return {x["custom_id"]: (x["response"]["body"]["usage"]["prompt_tokens"],
                                 json.dumps(x["response"]["body"]["choices"])) for x in rows}

    run_job(spec("ungrouped", "off"))
    assert texts(answers("ungrouped")) == texts(out)  # the same prompt and greedy answer per custom_id

    commits = sorted((tmp_path / "grouped" / "_fleetllm" / "commits").iterdir())
    lost = sum(json.loads(p.read_text())["rows"] for p in commits[:2])
    for p in commits[:2]:
        p.unlink()
    again = run_job(grouped)
    assert again["rows_computed"] == lost and again["shards_computed"] == 2
    assert texts(answers("grouped")) == texts(out)
