"""Text that is not valid Unicode (a lone surrogate escaped in JSON, bytes that are not UTF-8 in a CSV or
Parquet string column) becomes that row's error, naming the row, the field and the fix; the rows around it
keep their values (real pyarrow, real files)."""

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetllm.batch.inputs.input_files import _read_whole, read_shard, table_rows_checked, utf8_columns
from fleetllm.batch.planning.shards import Shard
from fleetllm.batch.execution.stages import render_template, table_from_rows
from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.chat import check_prompt_chars
from fleetllm.errors import FleetError, RowError
from fleetllm.unicode_text import lone_surrogate


def test_lone_surrogates_are_found_with_their_place_and_pairs_are_text():
    value = json.loads('{"messages": [{"role": "user", "content": "ok"}, {"content": ["x", "ab\\udfff"]}]}')
    assert lone_surrogate(value) == "messages[1].content[1] holds a lone UTF-16 surrogate U+DFFF at character 2"
    assert lone_surrogate(json.loads('{"\\ud800": 1}')) == "a key of the object holds a lone UTF-16 surrogate U+D800 at character 0"
    assert lone_surrogate(json.loads('{"a": "pair \\ud83d\\ude00", "b": [1, null, 2.5]}')) is None


def test_an_engine_refuses_a_prompt_with_a_lone_surrogate_naming_it():
    with pytest.raises(RowError, match=r"^messages\[0\]\.content holds a lone UTF-16 surrogate U\+D800 at character 3: "
                                       "it is not valid Unicode text; fix the escape"):
        check_prompt_chars(GenerationRequest(messages=[{"role": "user", "content": "hi \ud800"}]), 100, 4)
    with pytest.raises(RowError, match=r"^the prompt holds a lone"):
        check_prompt_chars(GenerationRequest(prompt="\udc01"), 100, 4)
    check_prompt_chars(GenerationRequest(prompt="pair \U0001F600"), 100, 4)  # a valid astral character


def test_a_jsonl_line_with_a_lone_surrogate_is_an_error_row_and_its_neighbours_are_read(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": 1, "t": "a"}\n\n{"id": 2, "t": "b \\ud800"}\n{"id": 3, "t": "\\ud83d\\ude00"}\n')
    rows = read_shard(Shard(0, str(src), "in.jsonl", 0, 3, 0, ""), "jsonl")
    assert rows[0] == {"id": 1, "t": "a", "_line": 0} and rows[2] == {"id": 3, "t": "\U0001F600", "_line": 2}
    assert rows[1]["_input_error"] == (
        "line 3 of in.jsonl is not valid Unicode text: t holds a lone UTF-16 surrogate U+D800 at character 2; fix "
        "the escape (a surrogate pair such as \\ud83d\\ude00 is one valid character) or remove it")
    assert rows[1]["_raw"] == '{"id": 2, "t": "b \\ud800"}\n' and "id" not in rows[1]
    array = tmp_path / "in.json"
    array.write_bytes(b'[{"id": 1}, {"a": {"b": "\\udbff"}}]')
    items = _read_whole(fsspec.filesystem("file"), str(array), "json")
    assert items[0] == {"id": 1} and items[1]["_input_error"].startswith(
        "item 1 of in.json is not valid Unicode text: a.b holds a lone UTF-16 surrogate U+DBFF")


def test_a_csv_column_with_a_byte_that_is_not_utf8_stays_text_and_only_that_row_fails(tmp_path):
    src = tmp_path / "rows.csv"
    src.write_bytes(b"id,t,n\n1,hello,5\n2,bad \xff byte,6\n3,caf\xc3\xa9,7\n")
    import pyarrow.csv as pacsv

    assert pacsv.read_csv(src).schema.field("t").type == pa.binary()  # what pyarrow makes of it
    table = utf8_columns(pacsv.read_csv(src), "rows.csv")
    assert table.schema.field("t").type == pa.string()
    assert table.column("t").to_pylist() == ["hello", None, "café"]
    assert table.column("_input_error").to_pylist() == [
        None, "row 2 of rows.csv (after the header): column 't' is not UTF-8 text (invalid start byte at byte 4); "
              "save the file as UTF-8", None]
    clean = utf8_columns(pa.table({"b": pa.array([b"ok"], pa.binary())}), "x.csv")  # a binary column of text
    assert clean.schema.field("b").type == pa.string() and "_input_error" not in clean.column_names


def test_a_parquet_string_that_is_not_utf8_fails_its_row_not_the_shard(tmp_path):
    raw = pa.array([b"hello", b"bad \xfe", b"ok"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # as a writer that does not check makes it
    pq.write_table(pa.table({"id": [1, 2, 3], "t": bad}), tmp_path / "rows.parquet")
    table = pq.read_table(tmp_path / "rows.parquet")
    with pytest.raises(UnicodeDecodeError):
        table.to_pylist()
    rows = table_rows_checked(table, 10, "rows.parquet")
    assert rows[0] == {"id": 1, "t": "hello"} and rows[2] == {"id": 3, "t": "ok"}
    assert rows[1] == {"_input_error": "row 11 of rows.parquet: column 't' holds a string that is not UTF-8 (invalid "
                                       "start byte at byte 4); rewrite the file with UTF-8 text, or store the column as binary"}
    shard = read_shard(Shard(0, str(tmp_path / "rows.parquet"), "rows.parquet", 1, 3, -1, ""), "parquet")
    assert [r.get("t") for r in shard] == [None, "ok"] and shard[0]["_input_error"].startswith("row 1 of rows.parquet")


def test_a_template_places_a_binary_columns_text_never_its_repr():
    assert render_template("Q: {x}", {"x": b"caf\xc3\xa9"}) == "Q: café"
    with pytest.raises(FleetError, match="column 'x' is binary data, not UTF-8 text"):
        render_template("Q: {x}", {"x": b"\x89PNG\xff"})


def test_rows_with_different_keys_make_one_table_whatever_comes_first():
    table = table_from_rows([{"_line": 0, "error": "bad line"}, {"_line": 1, "error": None, "_messages": "[]"}])
    assert table.column_names == ["_line", "error", "_messages"]
    assert table.column("_messages").to_pylist() == [None, "[]"]
