"""Input reading (local or fsspec URLs; discovery and compression in fleetllm.batch.inputs.discovery), and
atomic output writes. Input columns named like fleetllm's own are renamed as they are read
(fleetllm.batch.planning.input_names).

Line-based formats (jsonl, openai_batch) are read by byte offset, so reading shard k costs one
shard's bytes; parquet reads only the row groups a shard spans; csv and json arrays are parsed
whole (keep shards large for those).
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from fleetllm.batch.planning import content_id
from fleetllm.batch.output import store
from fleetllm.batch.inputs.discovery import EXTENSIONS, file_format, list_files, open_input  # noqa: F401 (the API)
from fleetllm.batch.planning.input_names import rename_row, rename_schema, rename_table
from fleetllm.batch.planning.shards import InputFile, Shard
from fleetllm.errors import InputError
from fleetllm.unicode_text import FIX, SURROGATE_ESCAPE, lone_surrogate, lone_surrogate_in_json

GROUPED_FORMAT = "grouped"  # fleetllm's own JSON lines (fleetllm.batch.planning.prefix): read as written, never renamed
LINE_FORMATS = ("jsonl", "openai_batch", GROUPED_FORMAT)
PEEK_BUFFER = 1 << 16  # bytes read at a time when peeking into a parquet file


def _line_offsets(fs, path: str, shard_rows: int) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
    """Count non-blank lines; note the byte offset where every shard_rows-th row starts, and a hash of
    each shard's bytes (fleetllm.batch.planning.content_id; hashed a shard at a time, not a line at a time)."""
    rows, pos, offsets, digests, shard = 0, 0, [], [], []
    with open_input(fs, path) as fh:
        for line in fh:
            if line.strip():
                if rows % shard_rows == 0:
                    offsets.append(pos)
                    if rows:
                        digests.append(content_id.digest(shard))
                        shard = []
                rows += 1
            if rows:
                shard.append(line)
            pos += len(line)
    if rows:
        digests.append(content_id.digest(shard))
    return rows, tuple(offsets), tuple(digests)


def _read_whole(fs, path: str, fmt: str) -> pa.Table | list[dict[str, Any]]:
    """A csv file as a table (pyarrow types each column); a JSON array as its rows, where an item
    that is not an object is a row with `_input_error` (typed later, by the job's column plan)."""
    with open_input(fs, path) as fh:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(fh)
            twice = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
            if twice:
                raise InputError(f"{path}: the CSV header names column(s) {twice} more than once (one would hide the "
                                 "other); give every column its own name")
            return utf8_columns(rename_table(table), posixpath.basename(path))
        if fmt == "json":
            raw = fh.read()
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"{path} is not valid JSON: {exc}") from None
            if not isinstance(data, list):
                raise InputError(f"{path} must hold a JSON array of objects (or use .jsonl)")
            escapes = SURROGATE_ESCAPE.search(raw) is not None  # once per file: clean files check no item
            return [_json_item(k, item, posixpath.basename(path), escapes) for k, item in enumerate(data)]
    raise AssertionError(fmt)


def _json_item(k: int, item: Any, name: str, escapes: bool) -> dict[str, Any]:
    """Item k of a JSON array file as a row, or a row with `_input_error` when it is not an object or
    holds text that is not valid Unicode (looked for only when the file holds a surrogate escape)."""
    if not isinstance(item, dict):
        return {"_input_error": f"item {k} of {name} is a JSON {type(item).__name__}, not an object",
                "_raw": json.dumps(item, default=str)[:2000]}
    bad_text = lone_surrogate(item) if escapes else None
    if bad_text:
        return {"_input_error": f"item {k} of {name} is not valid Unicode text: {bad_text}; {FIX}",
                "_raw": json.dumps(item)[:2000]}
    return rename_row(item)


def _whole_rows(fs, path: str, fmt: str, start: int, count: int) -> list[dict[str, Any]]:
    whole = _read_whole(fs, path, fmt)
    if isinstance(whole, pa.Table):
        rows = whole.slice(start, count).to_pylist()
        for row in rows:
            if "_input_error" in row and row["_input_error"] is None:  # a good row of a csv with bad ones
                del row["_input_error"]
        return rows
    return [dict(r) for r in whole[start:start + count]]


def describe_files(path: str, declared: str, shard_rows: int) -> list[InputFile]:
    """Each input file's rows, shard offsets and content identity; InputError naming a file that cannot
    be read (an empty or corrupt Parquet file, a broken compressed stream, a CSV without a header...)."""
    fs, entries = list_files(path, declared)
    files = []
    for url, rel in entries:
        fmt = file_format(url, declared)
        try:
            files.append(_describe(fs, url, rel, fmt, shard_rows))
        except InputError:
            raise
        except Exception as exc:  # any reader's failure: the file is named, with the reader's reason
            raise InputError(f"input file {rel!r} cannot be read as {fmt} ({type(exc).__name__}: {exc}); fix or "
                             "remove it, or move it under a folder starting with _ or . (those are skipped)") from None
    if not any(f.rows for f in files):
        raise InputError(f"input {path!r} has no rows")
    return files


def _describe(fs, url: str, rel: str, fmt: str, shard_rows: int) -> InputFile:
    p = fs._strip_protocol(url)
    info = fs.info(p)
    mtime = str(info.get("mtime") or info.get("LastModified") or info.get("updated") or "")
    offsets: tuple[int, ...] = ()
    digests: tuple[str, ...] = ()
    if fmt in LINE_FORMATS:
        rows, offsets, digests = _line_offsets(fs, p, shard_rows)
        content = content_id.combined(digests, rows)
    else:
        if fmt == "parquet":
            with fs.open(p, "rb") as fh:
                rows = pq.ParquetFile(fh).metadata.num_rows
        else:
            rows = len(_read_whole(fs, p, fmt))
        content = content_id.file_identity(fs, p, info)
    return InputFile(url, rel, int(info.get("size") or 0), mtime, rows, offsets, content, digests)


def plan_columns(files: list[InputFile], declared: str, skip: tuple[str, ...] = ()) -> pa.Schema:
    """One type per input column for the whole job (fleetllm.batch.planning.columns has the rule): parquet
    from the footers, csv from each file's table, JSON formats from every row."""
    from fleetllm.batch.planning.columns import CHUNK, TEXT, ColumnPlanner

    planner = ColumnPlanner(skip)
    for f in files:
        fs, _ = fsspec.core.url_to_fs(f.path)
        fmt = file_format(f.path, declared)
        if fmt == "parquet":
            with fs.open(f.path, "rb") as fh:
                planner.add_schema(rename_schema(pq.ParquetFile(fh).schema_arrow))
        elif fmt == "csv":
            schema = _read_whole(fs, f.path, fmt).schema
            if "_input_error" in schema.names:  # rows that are not UTF-8 text (utf8_columns)
                schema = schema.remove(schema.get_field_index("_input_error"))
            planner.add_schema(schema)
        elif fmt == "json":
            rows = _read_whole(fs, f.path, fmt)
            for k in range(0, len(rows), CHUNK):
                planner.add_rows(rows[k:k + CHUNK])
        else:
            with open_input(fs, f.path) as fh:
                chunk: list[bytes] = []
                for line in fh:
                    if line.strip():
                        chunk.append(line)
                    if len(chunk) >= CHUNK:
                        _plan_lines(planner, chunk)
                        chunk = []
                _plan_lines(planner, chunk)
    schema = planner.schema()
    if declared == "openai_batch" and "body" in schema.names:  # bodies differ in shape: text
        schema = schema.set(schema.get_field_index("body"), pa.field("body", TEXT))
    return schema


def _plan_lines(planner, lines: list[bytes]) -> None:
    """Parse JSON lines a chunk at a time (one json.loads of the chunk as an array: ~3x faster than
    one call per line); a chunk holding a bad line is parsed line by line, skipping that line."""
    try:
        rows = json.loads(b"[" + b",".join(lines) + b"]")
        if len(rows) != len(lines):  # a line such as `1, 2` is two values here, one bad row alone
            raise ValueError("not one value per line")
    except (ValueError, RecursionError):
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                continue  # the row is an error row; it has no columns
    rows = [row for row in rows if isinstance(row, dict)]
    if any(SURROGATE_ESCAPE.search(line) for line in lines):  # such a row is an error row: no columns
        rows = [row for row in rows if not lone_surrogate(row)]
    planner.add_rows(list(map(rename_row, rows)))


def read_shard(shard: Shard, declared: str, fs_url: str | None = None) -> list[dict[str, Any]]:
    """The rows of one shard, each with `_line` (0-based row index in its file).

    A jsonl line that is not a JSON object becomes a row with `_input_error` set, so it is
    recorded with its error instead of failing the shard or being dropped. A Hugging Face dataset's
    shards are read by fleetllm.batch.inputs.hf_input.read_shard.
    """
    fs, path = store.open_url(fs_url or shard.path)
    fmt = file_format(path, declared)
    rows: list[dict[str, Any]] = []
    if fmt in LINE_FORMATS:
        own = fmt == GROUPED_FORMAT
        with open_input(fs, path) as fh:
            fh.seek(shard.offset)
            index, physical, before = shard.start, 0, None  # physical: lines since shard.offset, blank ones too
            for line in fh:
                if index >= shard.stop:
                    break
                physical += 1
                if not line.strip():
                    continue
                problem = None
                try:
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError(f"a JSON {type(row).__name__}, not an object")
                    bad_text = lone_surrogate_in_json(line, row)
                    if bad_text:
                        problem = f"is not valid Unicode text: {bad_text}; {FIX}"
                    elif not own:
                        row = rename_row(row)
                except (ValueError, RecursionError) as exc:
                    problem = f"is not a JSON object: {exc}"
                if problem is not None:
                    before = _lines_before(fs, shard.path, shard.offset) if before is None else before
                    row = {"_input_error": f"line {before + physical} of {shard.rel} {problem}",
                           "_raw": line.decode("utf-8", "replace")[:2000]}
                row["_line"] = index
                rows.append(row)
                index += 1
        return rows
    if fmt == "parquet":
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            table = rename_table(_parquet_range(pf, shard.start, shard.stop))
        table_rows = table_rows_checked(table, shard.start, shard.rel)
    else:
        table_rows = _whole_rows(fs, path, fmt, shard.start, shard.rows)
    for k, row in enumerate(table_rows):
        row["_line"] = shard.start + k
        rows.append(row)
    return rows


def table_rows_checked(table: pa.Table, first: int, name: str) -> list[dict[str, Any]]:
    """table.to_pylist(), where a row holding a string that is not UTF-8 (a Parquet or Arrow file from a
    writer that does not check) becomes a row with `_input_error` naming the row and the column, instead of
    failing the shard."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError:
        pass
    rows: list[dict[str, Any]] = []
    for k in range(table.num_rows):
        one = table.slice(k, 1)
        try:
            rows.append(one.to_pylist()[0])
        except UnicodeDecodeError as exc:
            bad = [c for c in one.column_names if not _converts(one.column(c))]
            rows.append({"_input_error": f"row {first + k} of {name}: column {bad[0] if bad else '?'!r} holds a string "
                                         f"that is not UTF-8 ({exc.reason} at byte {exc.start}); rewrite the file with "
                                         "UTF-8 text, or store the column as binary"})
    return rows


def _converts(column: pa.ChunkedArray) -> bool:
    try:
        column.to_pylist()
        return True
    except UnicodeDecodeError:
        return False


def utf8_columns(table: pa.Table, name: str) -> pa.Table:
    """A CSV file's table with its binary columns as text: pyarrow's CSV reader types a column binary when
    a value in it is not UTF-8. Each value that is UTF-8 becomes text; a row holding one that is not gets
    `_input_error` (an extra column) naming the row and the column."""
    errors: dict[int, str] = {}
    for i, field in enumerate(table.schema):
        if not (pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type)):
            continue
        try:
            table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
            continue
        except pa.ArrowInvalid:
            pass
        values: list[str | None] = []
        for k, value in enumerate(table.column(i).to_pylist()):
            try:
                values.append(None if value is None else value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                values.append(None)
                errors.setdefault(k, f"row {k + 1} of {name} (after the header): column {field.name!r} is not UTF-8 "
                                     f"text ({exc.reason} at byte {exc.start}); save the file as UTF-8")
        table = table.set_column(i, field.name, pa.array(values, pa.string()))
    if errors:
        column = pa.array([errors.get(k) for k in range(table.num_rows)], pa.string())
        table = table.append_column("_input_error", column)
    return table


def _lines_before(fs, path: str, offset: int) -> int:
    """How many lines end before byte `offset` (only counted when a row is reported bad)."""
    count, left = 0, offset
    with open_input(fs, fs._strip_protocol(path)) as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count


def _parquet_range(pf: pq.ParquetFile, start: int, stop: int) -> pa.Table:
    groups, first_row, pos = [], None, 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if pos + n > start and pos < stop:
            groups.append(g)
            if first_row is None:
                first_row = pos
        pos += n
    table = pf.read_row_groups(groups)
    return table.slice(start - (first_row or 0), stop - start)


def peek_rows(path: str, declared: str, n: int = 5) -> list[dict[str, Any]]:
    """The first rows of the first file, to check columns at plan time."""
    fs, entries = list_files(path, declared)
    url, rel = entries[0]
    fmt = file_format(url, declared)
    shard = Shard(0, url, rel, 0, n, 0, "")
    p = fs._strip_protocol(url)
    if fmt == "parquet":
        # A buffered stream without pre-buffering reads only the first pages; reading row group 0
        # whole would cost the whole file for files written with pyarrow's default (~1M-row groups).
        with fs.open(p, "rb") as fh:
            pf = pq.ParquetFile(fh, buffer_size=PEEK_BUFFER, pre_buffer=False)
            batch = next(pf.iter_batches(batch_size=n), None)
        rows = [] if batch is None else table_rows_checked(rename_table(pa.Table.from_batches([batch])), 0, rel)
        return [r for r in rows if "_input_error" not in r]
    if fmt not in LINE_FORMATS:
        return [r for r in _whole_rows(fs, p, fmt, 0, n) if "_input_error" not in r]
    return [r for r in read_shard(shard, declared) if "_input_error" not in r]


def sync(fh) -> None:
    """Flush and fsync a file handle where the filesystem has one (object stores do not)."""
    if hasattr(fh, "flush"):
        fh.flush()
    if hasattr(fh, "fileno"):
        try:
            os.fsync(fh.fileno())
        except (OSError, ValueError, AttributeError):
            pass


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, write) -> None:
    """Write `path` whole or not at all (store.write_atomic: tmp + rename on file systems, one
    PUT on object stores)."""
    store.write_atomic(fs, path, write)
