"""Input column types, planned once per job, so every shard of a job writes one schema.

The rule (docs/batch-jobs.md "Which column types are written"):
- Parquet: the input files' schemas unified (int32 + int64 -> int64, int + float -> double, a column
  missing from a file -> null there). Read from the footers only.
- JSONL / JSON / CSV / OpenAI Batch: every row is read once at plan time and each column gets the
  type pyarrow infers for all its values together (int + float -> double, dicts with different keys
  -> one struct with all the keys).
- A column whose values fit no one Arrow type (strings and numbers, ints past int64, lists of mixed
  items, a dict in one row and a list in another, types that disagree across Parquet files) is
  `string`: strings as they are, every other value as its JSON text (7 -> "7", true -> "true",
  {"a": 1} -> '{"a": 1}', NaN -> "NaN").

Rows are coerced to the plan where they are read (`conform_row`), so every Ray Data block holds the
planned types, and each committed table is cast to it (`conform_table`), so a shard whose rows all lack
a value still writes the planned type. A value cannot make a job stop: at worst it becomes text.
"""

from __future__ import annotations

import json
from itertools import chain
from operator import methodcaller
from typing import Any, Iterable

import pyarrow as pa

CHUNK = 4096  # rows typed together at plan time (JSON formats); the chunks' types are then unified
TEXT = pa.string()


def unify(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """One type for two: Arrow's permissive promotion, else `string` (JSON text)."""
    if a == b:
        return a
    try:
        return pa.unify_schemas([pa.schema([("c", a)]), pa.schema([("c", b)])],
                                promote_options="permissive").field("c").type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return TEXT


INT64 = (-(2 ** 63), 2 ** 63 - 1)


def infer(values: list[Any]) -> pa.DataType:
    """The type pyarrow gives these values together; `string` where none fits them all."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not kinds:
        return pa.null()
    if len(kinds) == 1:  # the common cases, without pyarrow's per-value conversion
        kind = next(iter(kinds))
        if kind is str:
            return TEXT
        if kind is bool:
            return pa.bool_()
        if kind is float:
            return pa.float64()
        if kind is int:
            ints = [v for v in values if v is not None]
            return pa.int64() if INT64[0] <= min(ints) and max(ints) <= INT64[1] else TEXT
    try:
        return pa.array(values, from_pandas=False).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, ValueError, TypeError):
        return TEXT


class ColumnPlanner:
    """Fold rows (dicts) or Arrow schemas into one {column: type}, in first-seen column order."""

    def __init__(self, skip: Iterable[str] = ()) -> None:
        self.types: dict[str, pa.DataType] = {}
        self.skip = set(skip)

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Type a chunk of rows (dicts) together, then fold the chunk's types into the plan."""
        for name in dict.fromkeys(chain.from_iterable(rows)):
            if name not in self.skip and not name.startswith("_"):
                self._merge(name, infer(list(map(methodcaller("get", name), rows))))

    def add_schema(self, schema: pa.Schema) -> None:
        for field in schema:
            self._merge(field.name, field.type)

    def _merge(self, name: str, typ: pa.DataType) -> None:
        if name in self.skip or name.startswith("_"):
            return
        self.types[name] = unify(self.types[name], typ) if name in self.types else typ

    def schema(self) -> pa.Schema:
        return pa.schema(list(self.types.items()))


def describe(schema: pa.Schema | None) -> dict[str, str] | None:
    """The plan as it is recorded with the job (job.json parts, the fingerprint)."""
    return None if schema is None else {f.name: str(f.type) for f in schema}


def as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False, default=str)


def conform_row(row: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """Give the row every planned column (None where absent), as the planned type holds it."""
    for field in schema:
        value = row.get(field.name)
        if value is None:
            row[field.name] = None
        elif field.type == TEXT:
            row[field.name] = as_text(value)
        elif pa.types.is_floating(field.type) and isinstance(value, int) and not isinstance(value, bool):
            row[field.name] = float(value)
    return row


def conform_column(column: pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray | pa.Array:
    if column.type == typ:
        return column
    if typ == TEXT and not pa.types.is_string(column.type) and not pa.types.is_null(column.type):
        return pa.array([as_text(v) for v in column.to_pylist()], type=TEXT)
    try:
        return column.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array(column.to_pylist(), type=typ)


def conform_table(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """Cast the planned columns the table holds to their planned types (a shard whose rows all lack
    a value has a null column; one whose structs lack a key has a narrower struct)."""
    if schema is None:
        return table
    for field in schema:
        if field.name in table.column_names:
            i = table.column_names.index(field.name)
            table = table.set_column(i, field.name, conform_column(table.column(i), field.type))
    return table


# --- recorded with the job: a resume over the same input files reads the plan instead of the rows ---

RECORD = "_fleetllm/columns.json"


def input_key(files: list, declared: str, skip: Iterable[str]) -> str:
    """What the plan depends on: each input file's name and content identity (fleetllm.batch.planning.content_id),
    the format, and the rule renaming colliding columns (fleetllm.batch.planning.input_names)."""
    import hashlib

    ident = [[f.rel, f.identity] for f in files] + [declared, sorted(skip), "renamed"]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def recorded(folder: str, key: str) -> pa.Schema | None:
    """The plan recorded in the output folder for these same inputs, else None."""
    import base64

    import fsspec

    fs, root = fsspec.core.url_to_fs(folder)
    path = f"{root.rstrip('/')}/{RECORD}"
    try:
        with fs.open(path, "r") as fh:
            data = json.load(fh)
        if data.get("key") != key:
            return None
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"])))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None  # none recorded, or unreadable: plan again


def record(folder: str, key: str, schema: pa.Schema) -> None:
    import base64

    import fsspec

    fs, root = fsspec.core.url_to_fs(folder)
    data = {"key": key, "columns": describe(schema),
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}
    with fs.open(f"{root.rstrip('/')}/{RECORD}", "w") as fh:
        json.dump(data, fh, indent=1)
