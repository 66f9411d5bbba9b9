"""Reading one shard's rows for the engine: typed by the job's column plan, each with its shard and
file, and a grouped shard's rows (fleetllm.batch.planning.prefix) with their own file and line: `_file` and
`_source_line` (`_line` is the row's line in the grouped file, the shard's own order)."""

from __future__ import annotations

import json
from typing import Any

from fleetllm.batch.inputs import hf_input, input_files
from fleetllm.batch.planning.columns import conform_row
from fleetllm.batch.planning.shards import Shard


def read_shard_rows(item: dict[str, Any], declared: str, columns=None,
                     keep: list[str] | None = None) -> list[dict[str, Any]]:
    """A shard's rows, each value as the job's column plan types it (so every block agrees); `keep`:
    input.columns (the chosen columns only)."""
    shard = Shard(**{k: item[k] for k in Shard.__dataclass_fields__})
    rows = hf_input.read_shard(shard) if declared == "hf" else input_files.read_shard(shard, declared, shard.path)
    if shard.only_lines is not None:  # --retry-errors: only the failed rows (fleetllm.batch.output.retry_errors)
        wanted = set(shard.only_lines)
        rows = [row for row in rows if row["_line"] in wanted]
    if keep:
        rows = [hf_input.keep_columns(row, keep) for row in rows]
    grouped = declared == input_files.GROUPED_FORMAT
    for row in rows:
        row["_shard"] = shard.shard_id
        if "_src_line" in row:  # a row grouped by an earlier version, under its former names
            row["_file"], row["_source_line"] = row.pop("_src_file"), row.pop("_src_line")
        elif not (grouped and "_source_line" in row):  # a grouped row carries its own `_file` and `_source_line`
            row["_file"] = shard.rel
        if declared == "openai_batch" and "body" in row and not isinstance(row["body"], str):
            row["body"] = json.dumps(row["body"])  # bodies differ in shape: keep them as text in Arrow
        if columns is not None:
            conform_row(row, columns)
    return rows
