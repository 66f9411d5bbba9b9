"""What a run report is drawn from: the run record (OUT/_SUCCESS, run.json before) with its series, the
data files' token counts and errors (read column by column, shard by shard)."""

from __future__ import annotations

import json
import posixpath
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import fsspec

from fleetllm.errors import InputError

SAMPLES_PER_KIND = 3


@dataclass
class ReportData:
    run: dict[str, Any]
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    errors: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # kind -> samples
    error_counts: Counter = field(default_factory=Counter)
    node_rows: dict[str, float] = field(default_factory=dict)


def error_kind(message: str) -> str:
    """Errors grouped by kind: the text before the first colon, numbers and quoted values masked."""
    head = message.split(":", 1)[0] if ":" in message[:120] else message[:120]
    head = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", head)
    return re.sub(r"\d+", "N", head).strip() or "error"


def load(out_path: str) -> ReportData:
    from fleetllm.batch.output.commit import OutputFolder, read_run_record  # the commit protocol's own readers

    fs, root = fsspec.core.url_to_fs(out_path)
    run = read_run_record(out_path)
    if run is None:
        raise InputError(f"{out_path!r} has no run record (_SUCCESS, or run.json of earlier versions); "
                         "give the output folder of a finished `fleetllm run`")
    data = ReportData(run)

    fmt = ((run.get("spec") or {}).get("output") or {}).get("format", "parquet")
    entries = [vars(e) for e in OutputFolder(out_path, fmt).read_commits().values()]
    nodes: dict[str, float] = defaultdict(float)
    for e in entries:
        for n in e.get("nodes") or ["(unknown)"]:
            nodes[n] += e["rows"] / max(len(e.get("nodes") or [1]), 1)
        _read_rows(fs, posixpath.join(root, e["file"]), data)
    data.node_rows = dict(nodes)
    return data


def _read_rows(fs, path: str, data: ReportData) -> None:
    if not fs.exists(path):
        return
    columns = ("row_id", "num_input_tokens", "num_generated_tokens", "error")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            present = [c for c in columns if c in pf.schema_arrow.names]
            rows = pf.read(columns=present).to_pylist()
    else:  # jsonl (and openai_batch lines, whose rows carry no token columns at the top level)
        rows = [json.loads(line) for line in fs.cat(path).decode().splitlines() if line.strip()]
    for r in rows:
        if r.get("num_input_tokens"):  # a row that failed before the engine has none
            data.input_tokens.append(int(r["num_input_tokens"]))
        if r.get("num_generated_tokens") is not None and not r.get("error"):
            data.output_tokens.append(int(r["num_generated_tokens"]))
        message = r.get("error")
        if isinstance(message, dict):  # openai_batch: {"code", "message"}
            message = message.get("message")
        if message:
            kind = error_kind(str(message))
            data.error_counts[kind] += 1
            samples = data.errors.setdefault(kind, [])
            if len(samples) < SAMPLES_PER_KIND:
                row_id = str(r.get("row_id") or r.get("custom_id") or "")
                samples.append({"row_id": row_id, "error": str(message)[:300]})
