"""Input columns named like the columns fleetllm writes or uses inside a job are kept, renamed.

An input column whose name is one fleetllm writes (`row_id`, `generated_text`, `error`, `finish_reason`,
`attempts`, `num_input_tokens`, `num_generated_tokens`, `parsed`, `completions`, `logprobs`,
`embedding`) or uses internally (`_line`, `_file`, `_shard`, `_input_error`, `_raw`, `_messages`, ...)
is read as `input_<name>`, and `input_<name>` itself as `input_input_<name>`, and so on: one more
`input_` for a name that is a reserved one behind any number of `input_`. The rule depends on the name
alone, so every row and every file of a job agree, and no two input columns ever land on one name.

This is what makes a job over a previous job's output work: its `error` becomes `input_error` (the
previous run's error, kept next to this run's), its `generated_text` becomes `input_generated_text`
(use `{input_generated_text}` in the template), its `row_id` becomes `input_row_id`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from fleetllm.batch.execution.stages import INTERNAL_COLUMNS, WRITTEN_COLUMNS

PREFIX = "input_"
# Internal names earlier versions used (a grouped file's `_src_file` / `_src_line`, still read; the replica's
# columns now in `_run`): still reserved, so an input column of such a name is read as it always was.
FORMER_INTERNAL = frozenset({"_src_file", "_src_line", "_node", "_replica", "_ready", "_started", "_finished"})
# `sampling_params` and `messages` are input features a row may carry on purpose (not renamed)
RESERVED = frozenset(WRITTEN_COLUMNS) | {"embedding"} | FORMER_INTERNAL | {
    c for c in INTERNAL_COLUMNS if c.startswith("_")}


def reserved(name: str) -> bool:
    while name.startswith(PREFIX):
        name = name[len(PREFIX):]
    return name in RESERVED


def kept_name(name: str) -> str:
    """The name an input column is read under (itself unless it collides)."""
    return PREFIX + name if reserved(name) else name


def rename_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its colliding keys renamed (the same dict when none collides)."""
    if not any(map(reserved, row)):
        return row
    return {kept_name(k): v for k, v in row.items()}


def rename_table(table: pa.Table) -> pa.Table:
    names = table.column_names
    renamed = [kept_name(n) for n in names]
    return table if renamed == names else table.rename_columns(renamed)


def rename_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([field.with_name(kept_name(field.name)) for field in schema])


def renamed_hint(name: str) -> str:
    """A sentence for an error naming a column the input lacks because it was renamed, else ""."""
    if not reserved(name):
        return ""
    return (f"; {name!r} is a column fleetllm writes, so an input column of that name is read as {kept_name(name)!r} "
            f"(use {kept_name(name)!r} instead)")
