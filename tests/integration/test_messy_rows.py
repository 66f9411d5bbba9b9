"""Rows are data, never a reason to stop: any value of any type in any column gives that row a result
or an `error`, every row is written exactly once, and the folder reads back through pyarrow and Ray
with one type per column (the real runner, Ray Data and a tiny transformers model)."""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray

from fleetllm.batch.runner import run_job
from fleetllm.spec import JobSpec
from hostile_rows import HOSTILE, ROWS, check_rows


def make_spec(model: str, src: Path, out: Path, **over) -> JobSpec:
    data = {"name": "messy", "model": {"source": model, "engine": "transformers"},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{instruction}"},
            "sampling": {"max_tokens": 3}, "output": {"path": str(out), "shard_rows": 3},
            "compute": {"replicas": 1, "batch_size": 2}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return JobSpec.model_validate(data)


def read_back(out: Path) -> tuple[dict[str, dict], pa.Schema]:
    """The rows by row_id, each exactly once, as pyarrow and Ray both read them."""
    table = pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table()
    rows = table.to_pylist()
    ids = [r["row_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"a row was written more than once: {sorted(ids)}"
    via_ray = ray.data.read_parquet(str(out)).to_pandas()
    assert sorted(via_ray["row_id"]) == sorted(ids)
    schemas = {str(pq.read_schema(p)) for p in out.glob("part-*.parquet")}
    assert len(schemas) == 1, f"the parts disagree on the schema: {schemas}"
    return {r["row_id"]: r for r in rows}, table.schema


def test_a_hostile_jsonl_writes_every_row_once_at_any_batch_and_shard_size(ray_local, tiny_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(line for line, *_ in HOSTILE) + "\n")
    for batch_size, shard_rows in ((2, 3), (5, 4)):
        out = tmp_path / f"out-{batch_size}-{shard_rows}"
        spec = make_spec(tiny_model, src, out, output={"shard_rows": shard_rows},
                         compute={"batch_size": batch_size})
        report = run_job(spec)
        assert report["complete"] and report["rows"] == ROWS == 14
        rows, schema = read_back(out)
        check_rows(rows)
        assert rows["m11"]["num_generated_tokens"] <= 2  # the row's own sampling_params applied
        assert [rows[k]["extra"] for k in ("m4", "m5", "m6", "m7")] == ['{"k": 1}', "[1]", "-Infinity", "text"]
        assert {f.name: str(f.type) for f in schema if f.name in ("id", "instruction", "extra")} == {
            "id": "string", "instruction": "string", "extra": "string"}
        again = run_job(spec)  # the rerun resumes: nothing is computed again, nothing crashes
        assert again["rows_skipped"] == ROWS and again["rows_computed"] == 0
        assert len(read_back(out)[0]) == ROWS


def test_a_folder_of_files_that_disagree_on_types_reads_back_with_one_schema(ray_local, tiny_model, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3], "instruction": ["a", "b", "c"], "score": pa.array([1, 2, 3], pa.int32()),
                             "meta": [{"x": 1}, {"x": 2}, None]}), src / "a.parquet")
    pq.write_table(pa.table({"id": ["p4", "p5"], "instruction": [4, 5], "score": [0.5, math.inf],
                             "meta": [[1], [2]], "only_b": [True, False]}), src / "b.parquet")
    (src / "c.jsonl").write_text('{"id": 6, "instruction": "six", "score": 6}\n'
                                 '{"id": "j7", "instruction": ["l", 7], "meta": {"y": "z"}}\n')
    (src / "d.json").write_text(json.dumps([{"id": 8, "instruction": "eight", "score": None}, 9]))
    (src / "e.csv").write_text("id,instruction,score\n10,ten,10\n11,11,eleven\n")
    spec = make_spec(tiny_model, src, tmp_path / "out", output={"shard_rows": 2}, compute={"batch_size": 3})
    report = run_job(spec)
    assert report["complete"] and report["rows"] == 11
    rows, schema = read_back(tmp_path / "out")
    assert {f.name: str(f.type) for f in schema if f.name in ("id", "instruction", "score", "meta", "only_b")} == {
        "id": "string", "instruction": "string", "score": "string", "meta": "string", "only_b": "bool"}
    by_id = {r["id"]: r for r in rows.values()}
    assert sorted(by_id, key=str) == sorted(["1", "2", "3", "p4", "p5", "6", "j7", "8", None, "10", "11"], key=str)
    assert by_id["p4"]["instruction"] == "4" and by_id["j7"]["instruction"] == '["l", 7]'
    assert by_id["p5"]["score"] == "Infinity" and by_id["1"]["score"] == "1" and by_id["11"]["score"] == "eleven"
    assert by_id["1"]["meta"] == '{"x": 1}' and by_id["p4"]["meta"] == "[1]" and by_id["p4"]["only_b"] is True
    assert by_id[None]["error"] == "item 1 of d.json is a JSON int, not an object" and by_id[None]["row_id"] == "d.json:1"
    assert all(r["error"] is None for r in rows.values() if r["id"] is not None)
    assert run_job(spec)["rows_skipped"] == 11


def test_messages_of_any_shape_are_a_result_or_the_rows_error(ray_local, tiny_model, tmp_path):
    rows = [{"id": "ok", "messages": [{"role": "user", "content": "Hi"}]},
            {"id": "named", "messages": [{"role": "user", "content": "Hi", "name": None}]},
            {"id": "text", "messages": "hello"},
            {"id": "num", "messages": 7},
            {"id": "empty", "messages": []},
            {"id": "badpart", "messages": [{"role": "user", "content": 5}]},
            {"id": "norole", "messages": [{"content": "x"}]},
            {"id": "prompt", "prompt": 12345},
            {"id": "nested-prompt", "prompt": {"a": 1}}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = make_spec(tiny_model, src, tmp_path / "out", prompt={"template": None})
    assert run_job(spec)["rows"] == len(rows)
    out, _ = read_back(tmp_path / "out")
    errors = {k: (r["error"] or "")[:40] for k, r in out.items()}
    assert errors == {
        "ok": "", "named": "", "prompt": "",
        "text": "`messages` is text that is not JSON; giv",
        "num": "`messages` must be a non-empty list of {",
        "empty": "`messages` must be a non-empty list of {",
        "badpart": "messages[0].content must be text or a li",
        "norole": "messages[0] must be an object with a tex",
        "nested-prompt": ""}
    # `prompt` mixes a number and an object: the column is text, so the row's prompt is its JSON text
    assert out["nested-prompt"]["prompt"] == '{"a": 1}' and out["prompt"]["prompt"] == "12345"
