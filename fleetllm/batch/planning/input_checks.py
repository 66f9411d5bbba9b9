"""Plan-time checks of what the input holds: ids that must be unique (input.id_column, an OpenAI Batch
file's `custom_id`) and whether prompt.template's format specs can render the columns they name.

Both refuse the job before any model loads, naming the first few offenders and the fix.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from fleetllm.batch.inputs import input_files
from fleetllm.batch.inputs.discovery import open_input
from fleetllm.batch.planning.input_names import kept_name
from fleetllm.batch.planning.shards import InputFile
from fleetllm.errors import InputError, PlanError
from fleetllm.templates import TemplateError, check_renders

SHOWN = 5  # duplicate values named in the error


def id_values(f: InputFile, fmt: str, column: str) -> Iterator[Any]:
    """The values of `column` in one file, in order (None where a row lacks it)."""
    fs, path = input_files.store.open_url(f.path)
    if fmt == "parquet":
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            if column in pf.schema_arrow.names:
                yield from pf.read(columns=[column]).column(column).to_pylist()
        return
    if fmt in ("csv", "json"):
        for row in input_files._whole_rows(fs, path, fmt, 0, f.rows):
            yield row.get(kept_name(column))
        return
    with open_input(fs, path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue  # the row is an error row of its own
            yield row.get(column) if isinstance(row, dict) else None


def check_unique(files: list[InputFile], declared: str, column: str, what: str, fix: str) -> None:
    """InputError when two rows share a value of `column` (rows without one are not counted)."""
    counts: Counter[str] = Counter()
    for f in files:
        fmt = input_files.file_format(f.path, declared)
        counts.update(str(v) for v in id_values(f, fmt, column) if v is not None)
    twice = [(value, n) for value, n in counts.items() if n > 1]
    if twice:
        shown = ", ".join(f"{value!r} ({n} rows)" for value, n in twice[:SHOWN])
        more = f" and {len(twice) - SHOWN} more" if len(twice) > SHOWN else ""
        raise InputError(f"{what} is not unique: {shown}{more}; {fix}")


def check_ids(spec, files: list[InputFile]) -> None:
    """input.id_column, and an OpenAI Batch input's custom_id, name one row each."""
    if spec.input.format == "openai_batch":
        check_unique(files, "openai_batch", "custom_id", "custom_id in the OpenAI Batch input",
                     "each line needs its own custom_id (OpenAI refuses such a file too)")
    elif spec.input.id_column:
        check_unique(files, spec.input.format, spec.input.id_column, f"input.id_column {spec.input.id_column!r}",
                     "give each row its own id, or remove input.id_column to use file:line ids")


SAMPLES = {"string": "text", "large_string": "text", "bool": True}


def samples_of(columns: pa.Schema | None, rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A value standing for each column's planned type (what a row of the column holds once read);
    where no plan was made (Hugging Face datasets), the first rows' own values."""
    if columns is None:
        out: dict[str, list[Any]] = {}
        for row in rows:
            for k, v in row.items():
                if v is not None:
                    out.setdefault(k, []).append(v)
        return out
    out = {}
    for field in columns:
        t = field.type
        value = (SAMPLES.get(str(t)) if not (pa.types.is_integer(t) or pa.types.is_floating(t))
                 else 1 if pa.types.is_integer(t) else 1.5)
        if value is not None:
            out[field.name] = [value]
    return out


def check_template_renders(spec, columns: pa.Schema | None, rows: list[dict[str, Any]]) -> None:
    """PlanError when prompt.template's format specs cannot render the columns' values."""
    if not spec.prompt.template:
        return
    try:
        check_renders(spec.prompt.template, samples_of(columns, rows))
    except TemplateError as exc:
        raise PlanError(str(exc)) from None
