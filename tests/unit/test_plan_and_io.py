import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetllm.batch.inputs import input_files as bio
from fleetllm.batch.planning.shards import InputFile, plan_shards, shard_fingerprint
from fleetllm.errors import InputError


def _files(*rows):
    return [InputFile(f"/d/f{i}.jsonl", f"f{i}.jsonl", 10, "1", n) for i, n in enumerate(rows)]


def test_shards_split_files_deterministically_and_never_cross_files():
    shards = plan_shards(_files(25, 7), shard_rows=10)
    assert [(s.rel, s.start, s.stop) for s in shards] == [
        ("f0.jsonl", 0, 10), ("f0.jsonl", 10, 20), ("f0.jsonl", 20, 25), ("f1.jsonl", 0, 7)]
    assert [s.shard_id for s in shards] == [0, 1, 2, 3]
    assert plan_shards(_files(25, 7), shard_rows=10) == shards


def test_limit_cuts_across_files():
    shards = plan_shards(_files(25, 7), shard_rows=10, limit=27)
    assert sum(s.rows for s in shards) == 27
    assert shards[-1].rel == "f1.jsonl" and shards[-1].rows == 2


def test_shard_fingerprint_changes_with_the_file():
    a = plan_shards([InputFile("/x", "x", 10, "1", 5)], 5)[0]
    b = plan_shards([InputFile("/x", "x", 11, "2", 5)], 5)[0]
    assert shard_fingerprint("job", a) != shard_fingerprint("job", b)
    assert shard_fingerprint("job", a) == shard_fingerprint("job", a)


def test_jsonl_shards_read_by_offset(tmp_path):
    f = tmp_path / "in.jsonl"
    lines = [json.dumps({"i": i}) for i in range(23)]
    lines.insert(5, "")  # blank lines are not rows
    lines.insert(12, "[1, 2]")  # not an object: a row with an input error
    f.write_text("\n".join(lines) + "\n")
    files = bio.describe_files(str(f), "auto", shard_rows=10)
    assert files[0].rows == 24
    shards = plan_shards(files, 10)
    rows = [r for s in shards for r in bio.read_shard(s, "auto", s.path)]
    assert [r["_line"] for r in rows] == list(range(24))
    bad = [r for r in rows if "_input_error" in r]
    # the physical line: the blank line before it counts (it is the 12th row, on line 13)
    assert len(bad) == 1 and "line 13 of in.jsonl is not a JSON object" in bad[0]["_input_error"]


def test_parquet_shards_span_row_groups(tmp_path):
    f = tmp_path / "in.parquet"
    pq.write_table(pa.table({"i": list(range(50))}), f, row_group_size=7)
    shards = plan_shards(bio.describe_files(str(f), "auto", 12), 12)
    got = [r["i"] for s in shards for r in bio.read_shard(s, "auto", s.path)]
    assert got == list(range(50))


def test_csv_and_json_and_folder(tmp_path):
    (tmp_path / "a.csv").write_text("q\nx\ny\n")
    (tmp_path / "b.json").write_text(json.dumps([{"q": "z"}]))
    (tmp_path / "_ignored.jsonl").write_text("{}\n")
    files = bio.describe_files(str(tmp_path), "auto", 10)
    assert [(f.rel, f.rows) for f in files] == [("a.csv", 2), ("b.json", 1)]
    rows = [r["q"] for s in plan_shards(files, 10) for r in bio.read_shard(s, "auto", s.path)]
    assert rows == ["x", "y", "z"]


def test_missing_input_names_the_path(tmp_path):
    with pytest.raises(InputError, match="does not exist; check input.path"):
        bio.describe_files(str(tmp_path / "missing.jsonl"), "auto", 10)


def test_unknown_extension(tmp_path):
    (tmp_path / "data.txt").write_text("hi\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        bio.describe_files(str(tmp_path / "data.txt"), "auto", 10)


def _bytes_read() -> int | None:
    try:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))
    except OSError:
        return None


def test_parquet_peek_reads_a_few_pages_of_a_large_row_group(tmp_path):
    """Plan-time column checks stay cheap on files written with one big row group (pyarrow's default)."""
    import os

    f = tmp_path / "big.parquet"
    n = 200_000
    pq.write_table(pa.table({"i": list(range(n)), "text": [os.urandom(24).hex() for _ in range(n)]}), f,
                   row_group_size=n, use_dictionary=False)
    assert pq.ParquetFile(f).metadata.num_row_groups == 1
    before = _bytes_read()
    rows = bio.peek_rows(str(f), "auto", n=5)
    after = _bytes_read()
    assert rows == pq.read_table(f).slice(0, 5).to_pylist()
    if before is not None:
        size = f.stat().st_size
        assert after - before < size / 4, f"peek read {after - before} of {size} bytes"
