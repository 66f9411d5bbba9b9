"""The embed task of a batch job (`task: embed`): rows -> texts (preprocess) -> vectors (the engine stage).

A row's text comes from prompt.template, else its `text` or `prompt` column (`_embed_text`); an OpenAI
Batch line of url /v1/embeddings carries its own inputs (`_embed_inputs`: a JSON list of {text} or
{token_ids}, and `_embed_dimensions`). The engine stage writes `embedding` (one vector per row: a
fixed-size list<float32>[dims] column once committed) or, for Batch lines, `embeddings` (every input's
vector), with `num_input_tokens`, `error` and `attempts`. A row that fails keeps its error and is written.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fleetllm.batch.execution.stages import (TemplatePreprocessor, render_template, replica_id, replica_node_id,
                                   table_from_rows)
from fleetllm.batch.execution.telemetry import RUN, stamp
from fleetllm.engines.base import EmbeddingRequest, EmbeddingResult
from fleetllm.errors import FleetError

TEXT_COLUMNS = ("text", "prompt")  # where an embed row's text is found when the job has no prompt.template


class EmbedPreprocessor(TemplatePreprocessor):
    """Give each row `_embed_text` (template, else its `text`/`prompt` column) or an `error`."""

    def __init__(self, template: str | None, id_column: str | None = None) -> None:
        super().__init__(None, template, id_column)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        row["row_id"] = self._row_id(row)
        row["error"] = row.pop("_input_error", None)
        if row["error"] is not None:
            return row
        try:
            if self.template is not None:
                text = render_template(self.template, row)
            else:
                column = next((c for c in TEXT_COLUMNS if row.get(c) is not None), None)
                if column is None:
                    raise FleetError("the row has no `text` or `prompt` column and the job has no prompt.template")
                text = row[column]
                if not isinstance(text, str):
                    raise FleetError(f"column {column!r} holds {type(text).__name__}, not text")
                if not text.strip():
                    raise FleetError(f"column {column!r} is empty; nothing to embed")
            row["_embed_text"] = text
        except FleetError as exc:
            row["error"] = str(exc)
        return row


def embed_requests(row: dict[str, Any]) -> list[EmbeddingRequest]:
    rid = str(row.get("row_id", ""))
    if row.get("_embed_inputs") is not None:
        items = json.loads(row["_embed_inputs"])
        dims = row.get("_embed_dimensions")
        return [EmbeddingRequest(text=it.get("text"), token_ids=it.get("token_ids"),
                                 dimensions=int(dims) if dims is not None else None, request_id=f"{rid}-{i}")
                for i, it in enumerate(items)]
    return [EmbeddingRequest(text=row["_embed_text"], request_id=rid)]


def merge_results(results: list[EmbeddingResult]) -> dict[str, Any]:
    """One row's columns from its inputs' results: the first error fails the row (naming the input)."""
    errors = [(i, r.error) for i, r in enumerate(results) if r.error is not None]
    attempts = max([r.attempts or 1 for r in results] or [1])
    tokens = sum(r.num_input_tokens for r in results)
    if errors:
        i, error = errors[0]
        return {"error": f"input[{i}]: {error}" if len(results) > 1 else error, "num_input_tokens": tokens,
                "attempts": attempts, "_vectors": None}
    return {"error": None, "num_input_tokens": tokens, "attempts": attempts,
            "_vectors": [r.embedding for r in results]}


class EmbedStage:
    """A Ray Data callable class: one embedding engine per actor (replica), loaded once."""

    def __init__(self, engine_name: str, model_path: str, engine_kwargs: dict[str, Any],
                 chat_template_kwargs: dict[str, Any] | None = None, max_retries: int = 2,
                 node_id: str | None = None, rows_in_flight: int | None = None) -> None:
        from fleetllm.engines import create_engine

        # rows_in_flight sizes a generating vLLM only (fleetllm.engines.vllm_defaults); unused here
        self.engine = create_engine(engine_name, model_path, task="embed", engine_kwargs=engine_kwargs)
        self.engine.start()
        self.max_retries = 0 if self.engine.retries_requests else max_retries
        self.ready_at = time.time()
        self.node_id = replica_node_id(node_id)
        self.replica = replica_id()

    def _embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        """The batch; when the engine raises as a whole, each request alone, up to max_retries times."""
        try:
            return self.engine.embed(requests)
        except Exception as exc:  # isolate the failing rows, as the generate stage does
            batch_error = exc
        out = []
        for req in requests:
            error: Exception = batch_error
            for attempt in range(1, self.max_retries + 1):
                time.sleep(min(0.1 * 2 ** (attempt - 1), 2.0))
                try:
                    res = self.engine.embed([req])[0]
                    res.attempts = attempt + 1
                    out.append(res)
                    break
                except Exception as exc:
                    error = exc
            else:
                res = EmbeddingResult.failed(f"engine error after {self.max_retries + 1} attempt(s): {error}")
                res.attempts = self.max_retries + 1
                out.append(res)
        return out

    def __call__(self, batch):
        started = time.time()
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else list(batch)
        spans, requests = {}, []
        for i, row in enumerate(rows):
            if row.get("error"):
                continue
            try:
                reqs = embed_requests(row)
            except (FleetError, ValueError, TypeError, KeyError) as exc:
                row["error"] = f"invalid row: {exc}"
                continue
            spans[i] = (len(requests), len(requests) + len(reqs))
            requests.extend(reqs)
        results = self._embed(requests) if requests else []
        finished = time.time()
        run = stamp(self.node_id, self.replica, self.ready_at, started, finished)
        out = []
        for i, row in enumerate(rows):
            batch_line = row.get("_embed_inputs") is not None
            cols = {"error": row.get("error"), "num_input_tokens": 0, "attempts": 0, "_vectors": None}
            if i in spans:
                a, b = spans[i]
                cols = merge_results(results[a:b])
            vectors = cols.pop("_vectors")
            row.update(cols)
            row["num_generated_tokens"] = 0
            if batch_line:
                row["embeddings"] = vectors
            else:
                row["embedding"] = vectors[0] if vectors else None
            for key in ("_embed_text", "_embed_inputs", "_embed_dimensions"):
                row.pop(key, None)
            row[RUN] = run
            out.append(row)
        return table_from_rows(out)


def fixed_size_embedding(table, dims: int | None):
    """The `embedding` column as fixed-size list<float32>[dims] (dims: the model's, else the first vector's),
    so every shard shares one schema whether or not its rows failed."""
    import pyarrow as pa

    if "embedding" not in table.column_names:
        return table
    column = table.column("embedding")
    if dims is None:
        lengths = [len(v) for v in column.to_pylist() if v is not None]
        if not lengths:
            return table
        dims = lengths[0]
    i = table.column_names.index("embedding")
    values = [v if v is None or len(v) == dims else None for v in column.to_pylist()]
    if any(v is None and o is not None for v, o in zip(values, column.to_pylist())):
        raise ValueError(f"the engine returned vectors of a size other than {dims}; the embedding column "
                         "needs one size")
    return table.set_column(i, "embedding", pa.array(values, type=pa.list_(pa.float32(), dims)))
