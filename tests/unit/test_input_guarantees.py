"""Inputs are not taken on trust (issue 33): a file's identity is its content, discovery skips `_`/`.`
paths, unreadable files are refused at plan time naming them, compressed files are read by suffix,
colliding columns are kept renamed, duplicate ids and CSV headers are refused, templates only name
columns. Plans only: no engine, no Ray (the openai engine's plan needs no model)."""

import bz2
import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetllm.batch.inputs import input_files as bio
from fleetllm.batch.planning.job_plan import plan_job
from fleetllm.batch.planning.job_prepare import prepare
from fleetllm.batch.planning.shards import plan_shards
from fleetllm.errors import FleetError, InputError
from fleetllm.spec import JobSpec


def lines(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def shards_of(path, shard_rows=10):
    return plan_shards(bio.describe_files(str(path), "auto", shard_rows), shard_rows)


def rows_of(path, shard_rows=10, declared="auto"):
    files = bio.describe_files(str(path), declared, shard_rows)
    return [r for s in plan_shards(files, shard_rows) for r in bio.read_shard(s, declared, s.path)]


def job(tmp_path, src, **over) -> JobSpec:
    data = {"name": "j", "model": {"source": "m", "engine": "openai",
                                   "engine_kwargs": {"base_url": "http://127.0.0.1:9/v1"}},
            "input": {"path": str(src)}, "prompt": {"template": "{instruction}"},
            "output": {"path": str(tmp_path / "out")}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return JobSpec.model_validate(data)


# --- identity by content ------------------------------------------------------------------------

def test_a_file_replaced_with_the_same_size_and_mtime_changes_its_shards(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(lines({"instruction": f"question {i}"} for i in range(20)))
    before = shards_of(f)
    stat = f.stat()
    f.write_text(lines({"instruction": f"question {i}" if i != 13 else "QUESTION 13"} for i in range(20)))
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what `cp -p`, `rsync -a` and `tar x` keep
    assert f.stat().st_size == stat.st_size and f.stat().st_mtime_ns == stat.st_mtime_ns
    after = shards_of(f)
    assert before[0].identity() == after[0].identity()  # rows 0-9: the same bytes
    assert before[1].identity() != after[1].identity()  # row 13 changed


def test_a_parquet_file_replaced_with_the_same_size_and_mtime_is_a_new_identity(tmp_path):
    f = tmp_path / "in.parquet"
    pq.write_table(pa.table({"instruction": ["aaaa", "bbbb"]}), f, compression="none")
    before = shards_of(f)
    stat = f.stat()
    pq.write_table(pa.table({"instruction": ["aaaa", "bbbc"]}), f, compression="none")
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert f.stat().st_size == stat.st_size
    assert shards_of(f)[0].identity() != before[0].identity()


def test_appending_rows_changes_only_the_last_shard(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(lines({"instruction": f"q{i}"} for i in range(25)))
    before = shards_of(f)
    with f.open("a") as fh:
        fh.write(lines({"instruction": f"q{i}"} for i in range(25, 28)))
    after = shards_of(f)
    assert [s.identity() for s in after[:2]] == [s.identity() for s in before[:2]]
    assert after[2].identity() != before[2].identity() and after[2].rows == 8


def test_the_plan_names_the_files_whose_content_changed(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for name in ("a", "b"):
        (src / f"{name}.jsonl").write_text(lines({"instruction": f"{name}{i}"} for i in range(3)))
    assert prepare(plan_job(job(tmp_path, src))).changed_files == []  # prepare records the files' identities
    stat = (src / "b.jsonl").stat()
    (src / "b.jsonl").write_text(lines({"instruction": f"B{i}"} for i in range(3)))
    os.utime(src / "b.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    plan = plan_job(job(tmp_path, src))
    assert plan.changed_files == ["b.jsonl"]
    assert any("b.jsonl" in line and "changed" in line for line in plan.describe())


def test_plan_job_writes_nothing_and_prepare_writes_the_records(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(lines({"instruction": f"q{i}"} for i in range(5)))
    spec = job(tmp_path, src)
    out = Path(spec.output.path)
    plan = plan_job(spec)
    assert not out.exists() and plan.pending == plan.shards and plan.committed == {}  # pure: nothing written
    assert plan_job(spec).fingerprint == plan.fingerprint
    prepared = prepare(plan)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written and all(p.startswith("_fleetllm/") for p in written), written  # only fleetllm's records
    assert prepared.pending == plan.shards and prepared.fingerprint == plan.fingerprint


# --- discovery, unreadable and compressed files ---------------------------------------------------

def test_discovery_skips_every_component_starting_with_underscore_or_dot(tmp_path):
    for rel in ("a.jsonl", "_fleetllm/grouped/x/bucket-000000.jsonl", "sub/.cache/y.jsonl", "_tmp/z.jsonl",
                "sub/b.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(lines([{"instruction": rel}]))
    _, found = bio.list_files(str(tmp_path), "auto")
    assert [rel for _, rel in found] == ["a.jsonl", "sub/b.jsonl"]
    (tmp_path / "run.json").write_text("{}")  # an earlier version's run record, in a fleetllm output folder
    (tmp_path / "_fleetllm" / "job.json").write_text("{}")
    assert [rel for _, rel in bio.list_files(str(tmp_path), "auto")[1]] == ["a.jsonl", "sub/b.jsonl"]


@pytest.mark.parametrize("content, reason", [(b"", "size is 0 bytes"), (b"PAR1 not a parquet file PAR1", "")])
def test_an_unreadable_parquet_file_is_refused_at_plan_time_naming_it(tmp_path, content, reason):
    pq.write_table(pa.table({"instruction": ["x"]}), tmp_path / "good.parquet")
    (tmp_path / "broken.parquet").write_bytes(content)
    with pytest.raises(InputError, match=f"input file 'broken.parquet' cannot be read as parquet .*{reason}"):
        bio.describe_files(str(tmp_path), "auto", 10)


def test_compressed_inputs_are_read_by_their_suffix(tmp_path):
    import zstandard

    rows = [{"instruction": f"q{i}", "i": i} for i in range(23)]
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines(rows).encode()))
    (tmp_path / "b.json.bz2").write_bytes(bz2.compress(json.dumps(rows[:4]).encode()))
    (tmp_path / "c.csv.zst").write_bytes(zstandard.ZstdCompressor().compress(b"instruction,i\nx,1\ny,2\n"))
    got = rows_of(tmp_path, shard_rows=10)  # a.jsonl.gz in 3 shards, each read from its byte offset
    assert [r["i"] for r in got if r["_line"] is not None] == [*range(23), *range(4), 1, 2]
    assert not any("_input_error" in r for r in got)


def test_a_corrupt_compressed_file_is_refused_naming_it(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(InputError, match="input file 'a.jsonl.gz' cannot be read as jsonl"):
        bio.describe_files(str(tmp_path), "auto", 10)


# --- column collisions ---------------------------------------------------------------------------

def test_columns_named_like_output_or_internal_columns_are_kept_renamed(tmp_path):
    row = {"instruction": "q", "error": "old error", "row_id": "r7", "generated_text": "old text", "_line": 99,
           "input_error": "older error", "attempts": 3, "finish_reason": "length", "_messages": "m"}
    (tmp_path / "in.jsonl").write_text(lines([row]))
    got = rows_of(tmp_path / "in.jsonl")[0]
    assert got["_line"] == 0  # fleetllm's own
    assert {k: got[k] for k in got if k.startswith("input_")} == {
        "input_error": "old error", "input_row_id": "r7", "input_generated_text": "old text", "input__line": 99,
        "input_input_error": "older error", "input_attempts": 3, "input_finish_reason": "length",
        "input__messages": "m"}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "in.parquet")
    assert {k: v for k, v in rows_of(tmp_path / "in.parquet")[0].items() if k != "_line"} == {
        k: v for k, v in got.items() if k != "_line"}
    columns = bio.plan_columns(bio.describe_files(str(tmp_path / "in.jsonl"), "auto", 10), "auto")
    assert "input_error" in columns.names and "input__line" in columns.names and "error" not in columns.names


def test_a_template_naming_a_renamed_column_is_refused_with_its_new_name(tmp_path):
    (tmp_path / "in.jsonl").write_text(lines([{"generated_text": "a summary", "row_id": "x"}]))
    with pytest.raises(InputError, match="'generated_text' is a column fleetllm writes.*'input_generated_text'"):
        plan_job(job(tmp_path, tmp_path / "in.jsonl", prompt={"template": "Shorter: {generated_text}"}))
    with pytest.raises(InputError, match="read as 'input_row_id'"):
        plan_job(job(tmp_path, tmp_path / "in.jsonl", prompt={"template": "{input_generated_text}"},
                     input={"id_column": "row_id"}))
    plan_job(job(tmp_path, tmp_path / "in.jsonl", prompt={"template": "{input_generated_text}"},
                 input={"id_column": "input_row_id"}))


# --- duplicates ----------------------------------------------------------------------------------

def test_duplicate_ids_are_refused_at_plan_time_naming_them(tmp_path):
    (tmp_path / "a.jsonl").write_text(lines({"id": i % 4, "instruction": "q"} for i in range(7)))
    with pytest.raises(InputError, match=r"input.id_column 'id' is not unique: '0' \(2 rows\), '1' \(2 rows\), "
                                         r"'2' \(2 rows\);"):
        plan_job(job(tmp_path, tmp_path / "a.jsonl", input={"id_column": "id"}))
    pq.write_table(pa.table({"id": ["x", "y", "x"], "instruction": ["a", "b", "c"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"'x' \(2 rows\)"):
        plan_job(job(tmp_path, tmp_path / "b.parquet", input={"id_column": "id"}))


def test_duplicate_custom_ids_in_an_openai_batch_file_are_refused(tmp_path):
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}
    (tmp_path / "batch.jsonl").write_text(lines({**line, "custom_id": f"req-{i % 2}"} for i in range(3)))
    spec = job(tmp_path, tmp_path / "batch.jsonl", input={"format": "openai_batch"}, prompt={"template": None})
    with pytest.raises(InputError, match=r"custom_id .* not unique: 'req-0' \(2 rows\)"):
        plan_job(spec)


def test_a_csv_with_a_duplicate_header_is_refused(tmp_path):
    (tmp_path / "in.csv").write_text("instruction,note,note\nq,a,b\n")
    with pytest.raises(InputError, match=r"in.csv.*names column\(s\) \['note'\] more than once"):
        bio.describe_files(str(tmp_path / "in.csv"), "auto", 10)


# --- templates -----------------------------------------------------------------------------------

@pytest.mark.parametrize("template, message", [
    ("{instruction.__class__.__mro__}", "attribute access"),
    ("{x.upper}", "attribute access"),
    ("{instruction:>99999999}", "pads to 99999999 characters"),
    ("{score:.5000f}", "asks for 5000 digits"),
    ("{instruction:{width}}", "field inside its format spec"),
    ("{}", "positional field"),
])
def test_templates_may_only_name_columns(tmp_path, template, message):
    with pytest.raises(ValueError, match=f"prompt.template .*{message}"):  # pydantic's ValidationError
        job(tmp_path, "in.jsonl", prompt={"template": template})


def test_a_format_spec_that_cannot_render_its_column_is_a_plan_error(tmp_path):
    (tmp_path / "in.jsonl").write_text(lines([{"instruction": "q", "n": 3, "x": 1.5}]))
    with pytest.raises(FleetError, match=r"prompt.template '\{instruction:d\}'.*cannot render column 'instruction'"):
        plan_job(job(tmp_path, tmp_path / "in.jsonl", prompt={"template": "{instruction:d}"}))
    plan_job(job(tmp_path, tmp_path / "in.jsonl", prompt={"template": "{n:03d} {x:.2f} {instruction:>8} {instruction!r}"}))
