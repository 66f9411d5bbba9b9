"""The input column plan: one type per column for a whole job, whatever the rows hold."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from fleetllm.batch.inputs import input_files as bio
from fleetllm.batch.planning.columns import CHUNK, ColumnPlanner, conform_row, conform_table, unify
from fleetllm.batch.planning.shards import plan_shards


def plan_of(rows):
    planner = ColumnPlanner(skip=("error",))
    for k in range(0, len(rows), CHUNK):
        planner.add_rows(rows[k:k + CHUNK])
    return planner.schema()


def test_each_column_gets_one_type_and_text_where_values_disagree():
    schema = plan_of([
        {"id": "m0", "n": 1, "f": 1, "b": True, "s": "Hi", "big": 1, "d": {"a": 1}, "l": [1], "mix": {"a": 1},
         "error": 5, "_x": 1},
        {"id": 1, "n": 2, "f": 2.5, "b": None, "s": "日本", "big": 2 ** 64, "d": {"b": "x"}, "l": ["a"], "mix": [1]},
        {"id": None, "n": None, "f": float("nan"), "nul": None},
    ])
    assert {f.name: str(f.type) for f in schema} == {
        "id": "string", "n": "int64", "f": "double", "b": "bool", "s": "string", "big": "string",
        "d": "struct<a: int64, b: string>", "l": "string", "mix": "string", "nul": "null"}


def test_types_of_separate_chunks_are_unified_the_same_way():
    rows = [{"v": 1}] * 5000 + [{"v": "x"}]  # the string is in a later chunk than the ints
    assert plan_of(rows).field("v").type == pa.string()
    assert unify(pa.int32(), pa.int64()) == pa.int64()
    assert unify(pa.int64(), pa.float64()) == pa.float64()
    assert unify(pa.null(), pa.list_(pa.int64())) == pa.list_(pa.int64())
    assert unify(pa.timestamp("s"), pa.string()) == pa.string()


def test_rows_are_conformed_to_the_plan_and_tables_cast_to_it():
    schema = pa.schema([("id", pa.string()), ("f", pa.float64()), ("d", pa.struct([("a", pa.int64()),
                                                                                 ("b", pa.string())]))])
    row = conform_row({"id": 7, "f": 2, "extra": 1}, schema)
    assert row == {"id": "7", "f": 2.0, "d": None, "extra": 1}
    assert conform_row({"id": {"k": [1, None]}, "f": float("inf")}, schema)["id"] == '{"k": [1, null]}'
    assert conform_row({"id": float("nan")}, schema)["id"] == "NaN"
    table = pa.table({"id": pa.array([None, None]), "d": pa.array([{"a": 1}, None]), "x": [1, 2]})
    out = conform_table(table, schema)
    assert out.schema.field("id").type == pa.string() and out.schema.field("d").type == schema.field("d").type
    assert out.column("d").to_pylist() == [{"a": 1, "b": None}, None] and out.column("x").to_pylist() == [1, 2]


def test_parquet_files_that_disagree_are_planned_from_their_footers(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "x": pa.array([1, 2], pa.int32()), "y": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["c"], "x": pa.array([3], pa.int64()), "y": ["z"], "z": [[1.5]]}),
                   tmp_path / "b.parquet")
    files = bio.describe_files(str(tmp_path), "auto", 10)
    schema = bio.plan_columns(files, "auto")
    assert {f.name: str(f.type) for f in schema} == {
        "id": "string", "x": "int64", "y": "string", "z": "list<element: double>"}


def test_jsonl_planning_skips_bad_lines_and_json_arrays_keep_non_objects_as_error_rows(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text('{"a": 1}\n\n[1, 2]\nnot json\n{"a": "x"}\n' + "[" * 100000 + "\n")
    files = bio.describe_files(str(f), "auto", 10)
    assert files[0].rows == 5
    assert str(bio.plan_columns(files, "auto").field("a").type) == "string"
    rows = bio.read_shard(plan_shards(files, 10)[0], "auto", str(f))
    assert [r.get("_input_error", "")[:34] for r in rows] == [
        "", "line 3 of in.jsonl is not a JSON o", "line 4 of in.jsonl is not a JSON o", "",
        "line 6 of in.jsonl is not a JSON o"]
    arr = tmp_path / "in.json"
    arr.write_text(json.dumps([{"a": 1}, 7, {"a": "x", "b": [1]}, None]))
    files = bio.describe_files(str(arr), "auto", 10)
    assert files[0].rows == 4 and str(bio.plan_columns(files, "auto").field("a").type) == "string"
    rows = bio.read_shard(plan_shards(files, 10)[0], "auto", str(arr))
    assert [r.get("_input_error") for r in rows] == [
        None, "item 1 of in.json is a JSON int, not an object", None, "item 3 of in.json is a JSON NoneType, not an object"]


def test_jsonl_error_gives_the_physical_line_in_later_shards(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text('{"a": 1}\n\n\n{"a": 2}\n\n{"a": 3}\n{bad\n')  # rows on lines 1, 4, 6, 7
    files = bio.describe_files(str(f), "auto", 2)
    second = plan_shards(files, 2)[1]
    rows = bio.read_shard(second, "auto", str(f))
    assert rows[0]["a"] == 3 and rows[1]["_input_error"].startswith("line 7 of in.jsonl is not a JSON object")
