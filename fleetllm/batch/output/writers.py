"""Data file writers for committed shards: parquet, jsonl, and OpenAI Batch output files."""

from __future__ import annotations

import json
from typing import Any


class ParquetWriter:
    ext = "parquet"

    def write(self, fh, table) -> None:
        import pyarrow.parquet as pq

        pq.write_table(table, fh)

    def finalize(self, out, plan) -> None:
        """Nothing to do: the parts are the output."""


class JsonlWriter:
    ext = "jsonl"

    def write(self, fh, table) -> None:
        for row in table.to_pylist():
            fh.write((json.dumps(row, ensure_ascii=False, default=str) + "\n").encode())

    def finalize(self, out, plan) -> None:
        """Nothing to do: the parts are the output."""


def shard_writer(fmt: str) -> Any:
    if fmt == "parquet":
        return ParquetWriter()
    if fmt == "jsonl":
        return JsonlWriter()
    if fmt == "openai_batch":
        from fleetllm.batch.inputs.openai_batch import OpenAIBatchWriter

        return OpenAIBatchWriter()
    raise ValueError(f"unknown output format {fmt!r}")
