"""Pipeline stages: rows -> requests (preprocess), requests -> results (the engine stage).

Stage inputs: a row carries either `messages` (a list of {role, content}) or `prompt` (text), and
optionally `sampling_params` (a dict: that row's own sampling, which replaces the job's; the job's own
`sampling` is parsed once and handed to the engine stage at construction, never stamped on rows). The job's
preprocessor hands the engine stage `_messages`, the
messages as JSON text, so the column has one Arrow type whatever the rows hold (content text in one
row, content parts in another); the input's own `messages` column is left as it was read. A row whose
preparation failed carries `error` and skips the engine; it is still written, so no row is ever dropped.
"""

from __future__ import annotations

import json
import time
from types import MappingProxyType
from typing import Any, Callable, Mapping

from fleetllm.batch.execution.telemetry import RUN, stamp
from fleetllm.engines.base import GenerationRequest, GenerationResult
from fleetllm.errors import EndpointError, FleetError
from fleetllm.structured import StructuredOutput

OUTPUT_COLUMNS = ("generated_text", "num_input_tokens", "num_generated_tokens", "finish_reason", "error")
# Columns the job runner uses internally and drops before writing (docs/architecture.md names them): `_run`
# is the replica's telemetry (fleetllm.batch.execution.telemetry), `_source_line` a grouped shard's row's line
# in its own file (fleetllm.batch.planning.prefix; `_line` is its line in the shard's file).
INTERNAL_COLUMNS = ("_shard", "_line", "_file", RUN, "_input_error", "_raw", "sampling_params", "_prompt_token_ids",
                    "_messages", "_source_line", "_cached_tokens", "_images", "_adapter")
# The output columns' types: shards whose rows all lack a value (a null column) still share one schema.
OUTPUT_TYPES = {"row_id": "string", "generated_text": "string", "num_input_tokens": "int64",
                "num_generated_tokens": "int64", "finish_reason": "string", "error": "string", "attempts": "int64",
                "parsed": "string"}
# Columns the stages write: an input column of the same name is replaced, so it is not planned.
WRITTEN_COLUMNS = (*OUTPUT_TYPES, "completions", "logprobs")


class TemplatePreprocessor:
    """Build `messages` for a row from the job's prompt spec (a row's own `sampling_params`, when it has one,
    kept as JSON text: one Arrow type whatever the rows hold)."""

    def __init__(self, system: str | None, template: str | None,
                 id_column: str | None = None, image_column: str | None = None,
                 adapter_column: str | None = None, adapters: tuple[str, ...] = ()) -> None:
        self.system = system
        self.template = template
        self.id_column = id_column
        self.image_column = image_column
        self.adapter_column = adapter_column
        self.adapters = tuple(adapters)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        row["row_id"] = self._row_id(row)
        row["error"] = row.pop("_input_error", None)
        sampling = row.get("sampling_params")  # a row's own sampling (JSON text or a dict); else the stage's
        if sampling is not None and not isinstance(sampling, str):
            row["sampling_params"] = json.dumps(sampling, default=str)
        if row["error"] is not None:
            return row
        try:
            if self.adapter_column:
                row["_adapter"] = row_adapter(row.get(self.adapter_column), self.adapter_column, self.adapters)
            if self.template is not None:
                messages = [{"role": "user", "content": render_template(self.template, row)}]
                if self.image_column and row.get(self.image_column) is not None:
                    messages[0]["content"] = [image_part(row[self.image_column], self.image_column),
                                              {"type": "text", "text": messages[0]["content"]}]
            elif row.get("messages") is not None:
                messages = checked_messages(row["messages"])
            elif row.get("prompt") is not None:
                if isinstance(row["prompt"], (dict, list)):
                    raise FleetError(f"`prompt` must be text, not a {type(row['prompt']).__name__}")
                row["prompt"] = str(row["prompt"])
                if not row["prompt"].strip():
                    raise FleetError("the prompt is empty")
                return row
            else:
                raise FleetError("the row has no `messages` or `prompt` column and the job has no prompt.template")
            if self.system and not any(m.get("role") == "system" for m in messages):
                messages.insert(0, {"role": "system", "content": self.system})
            row["_messages"] = json.dumps(messages, ensure_ascii=False)
        except FleetError as exc:
            row["error"] = str(exc)
        except Exception as exc:  # rows are data: any value makes a row error, never a failed task
            row["error"] = f"invalid row: {type(exc).__name__}: {exc}"
        return row

    def _row_id(self, row: dict[str, Any]) -> str:
        if self.id_column:
            value = row.get(self.id_column)
            if value is not None:
                return str(value)
        line = row.get("_source_line", row["_line"])  # a grouped shard's row: its line in its own file
        return f"{row.get('_file', '')}:{line}" if "_file" in row else str(line)


def row_adapter(value: Any, column: str, adapters: tuple[str, ...]) -> str | None:
    """A row's LoRA adapter from its adapter column (None/empty: the base model); FleetError when unknown."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if str(value) not in adapters:
        raise FleetError(f"column {column!r} names LoRA adapter {value!r}, which is not in model.lora_adapters "
                         f"{sorted(adapters)}; fix the value or add the adapter (empty means the base model)")
    return str(value)


def image_part(value: Any, column: str) -> dict[str, Any]:
    """An image_url content part from an image column's value: bytes (sent as a data: URL), or text naming
    the image (a local path, an object-store URL, an https:// or data: URL)."""
    import base64

    if isinstance(value, dict) and "bytes" in value:  # Hugging Face datasets' Image feature
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        url = "data:image;base64," + base64.b64encode(bytes(value)).decode("ascii")
    elif isinstance(value, str) and value.strip():
        url = value.strip()
    else:
        raise FleetError(f"column {column!r} (prompt.image_column) holds {type(value).__name__}, not image bytes, a "
                         "path or a URL")
    return {"type": "image_url", "image_url": {"url": url}}


def adapter_order(requests: list[GenerationRequest]) -> list[int]:
    """The order that puts the rows of one LoRA adapter next to each other (base rows first, input order kept
    within an adapter), so the engine holds few adapters at a time (benchmarks/lora_grouping.py)."""
    return sorted(range(len(requests)), key=lambda k: requests[k].adapter or "")


def table_from_rows(rows: list[dict[str, Any]]):
    """An Arrow table of rows whose keys differ (an error row lacks the columns a good row gets): every
    key of any row is a column, None where a row lacks it. `pa.Table.from_pylist` takes its columns from
    the first row only, so a shard starting with an error row would lose the others' prompts."""
    import pyarrow as pa

    keys = list(dict.fromkeys(k for row in rows for k in row))
    return pa.Table.from_pydict({k: [row.get(k) for row in rows] for k in keys})


def checked_messages(value: Any) -> list[dict[str, Any]]:
    """A row's `messages` (a list, or its JSON text where the column mixes types) as a list of
    {role, content} dicts; FleetError naming what is wrong otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise FleetError("`messages` is text that is not JSON; give a list of {role, content} objects") from None
    if not isinstance(value, list) or not value:
        raise FleetError(f"`messages` must be a non-empty list of {{role, content}} objects, not {value!r:.80}")
    messages = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise FleetError(f"messages[{k}] must be an object with a text `role`, not {m!r:.80}")
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise FleetError(f"messages[{k}].content must be text or a list of parts, not {content!r:.80}")
        messages.append({key: v for key, v in m.items() if v is not None})
    return messages


def render_template(template: str, row: dict[str, Any]) -> str:
    try:
        text = template.format_map(_StrictRow(row))
    except KeyError as exc:
        present = sorted(k for k, v in row.items() if v is not None and not k.startswith("_")
                         and k not in ("error", "row_id", "sampling_params"))
        raise FleetError(f"prompt.template needs column {exc.args[0]!r}, which this row lacks "
                         f"(columns present: {present})") from None
    if not text.strip():
        raise FleetError("the prompt is empty after formatting the template")
    return text


class _StrictRow(dict):
    def __missing__(self, key: str) -> Any:
        raise KeyError(key)

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if value is None:
            raise KeyError(key)
        if isinstance(value, (bytes, bytearray)):  # a binary column: its text, never its repr (b'...')
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FleetError(f"column {key!r} is binary data, not UTF-8 text ({exc.reason} at byte {exc.start}): "
                                 "prompt.template can only place text; decode the column or leave it out") from None
        return value


def row_sampling(row: dict[str, Any], default: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sampling a row runs with: its own `sampling_params` (a dict, or JSON text as the table carries it)
    when it has one, else the job's (`default`, handed to the engine stage at construction)."""
    own = row.get("sampling_params")
    if own is None:
        return dict(default or {})
    return json.loads(own) if isinstance(own, str) else dict(own)


def request_from_row(row: dict[str, Any], chat_template_kwargs: dict[str, Any] | None = None,
                     sampling: Mapping[str, Any] | None = None) -> GenerationRequest:
    """The engine request of a prepared row; `sampling`: the job's, for rows without their own."""
    sampling = row_sampling(row, sampling)
    messages = row.get("_messages")  # the job's preprocessor: JSON text; a user's preprocess: `messages`
    messages = json.loads(messages) if isinstance(messages, str) else row.get("messages")
    prompt = row.get("prompt") if messages is None else None
    return GenerationRequest(messages=messages, prompt=prompt, sampling=dict(sampling),
                             chat_template_kwargs=dict(chat_template_kwargs or {}),
                             request_id=str(row.get("row_id", "")), prompt_token_ids=row.get("_prompt_token_ids"),
                             images=row.get("_images") or None, adapter=row.get("_adapter") or None)


def generate_with_retries(engine_generate: Callable[[list[GenerationRequest]], list[GenerationResult]],
                          requests: list[GenerationRequest], max_retries: int,
                          sleep: Callable[[float], None] = time.sleep) -> tuple[list[GenerationResult], list[int]]:
    """Run a batch; when the engine raises, retry the rows one by one (each up to max_retries).

    This is compute.max_retries: it re-runs rows only when the engine call raises as a whole. Per-row
    errors the engine reports (prompt too long, bad sampling value, an HTTP request that failed after
    the openai engine's own retries) are final. Returns (results, attempts per row).
    """
    try:
        return engine_generate(requests), [1] * len(requests)
    except EndpointError:
        raise  # not the rows' fault: the job stops, the rows are not committed
    except Exception as exc:  # the batch failed as a whole: isolate the failing rows
        batch_error = exc
    results, attempts = [], []
    for req in requests:
        error: Exception = batch_error
        for attempt in range(1, max_retries + 1):
            sleep(min(0.1 * 2 ** (attempt - 1), 2.0))
            try:
                results.append(engine_generate([req])[0])
                attempts.append(attempt + 1)
                break
            except EndpointError:
                raise
            except Exception as exc:
                error = exc
        else:
            calls = f"{max_retries + 1} attempts" if max_retries else "1 attempt"
            results.append(GenerationResult.failed(f"engine error after {calls}: {error}"))
            attempts.append(max_retries + 1)
    return results, attempts


def result_columns(result: GenerationResult, attempts: int, n: int,
                   structured: StructuredOutput | None = None) -> dict[str, Any]:
    """The output columns of one row. `attempts` is the engine's own count when it reports one (the
    openai engine: HTTP attempts), else the engine calls the stage made for the row. A row with a
    structured-output constraint also gets `parsed` (the JSON value as text, JSON constraints only)
    and `error` when its text does not satisfy the constraint (e.g. JSON cut short by max_tokens)."""
    first = result.completions[0] if result.completions else None
    cols: dict[str, Any] = {
        "generated_text": first.text if first else None,
        "num_input_tokens": result.num_input_tokens,
        "num_generated_tokens": result.num_generated_tokens,
        "finish_reason": first.finish_reason if first else None,
        "error": result.error,
        "attempts": result.attempts if result.attempts is not None else attempts,
    }
    if n > 1:
        cols["completions"] = [
            {"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
             "num_generated_tokens": c.num_generated_tokens} for c in result.completions
        ]
    if first is not None and first.logprobs is not None:
        cols["logprobs"] = json.dumps(first.logprobs)
    if structured is not None:
        checked = [structured.check(c.text, c.finish_reason) for c in result.completions]
        cols["parsed"] = checked[0][0] if checked else None
        problems = [f"completion {c.index}: {err}" if len(checked) > 1 else err
                    for c, (_, err) in zip(result.completions, checked) if err]
        if problems and cols["error"] is None:
            cols["error"] = "structured output: " + "; ".join(problems)
        if "completions" in cols:
            for entry, (parsed, _) in zip(cols["completions"], checked):
                entry["parsed"] = parsed
    return cols


def replica_node_id(node_id: str | None = None) -> str:
    """The node a replica runs on: `node_id` as given (in-process runs, fleetllm.batch.execution.local_run, have no
    Ray node), else the Ray node's id, else ""."""
    if node_id is not None:
        return node_id
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""


def replica_id() -> str:
    """This replica's id: the Ray actor's (first 12 hex digits), or "" outside an actor (in-process runs)."""
    try:
        import ray

        actor = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    except Exception:
        actor = None
    return (actor or "")[:12]


class EngineStage:
    """A Ray Data callable class: one engine per actor (replica), loaded once."""

    def __init__(self, engine_name: str, model_path: str, engine_kwargs: dict[str, Any],
                 chat_template_kwargs: dict[str, Any] | None = None, max_retries: int = 2,
                 node_id: str | None = None, rows_in_flight: int | None = None,
                 sampling: Mapping[str, Any] | None = None, progress_board: Any = None) -> None:
        from fleetllm.engines import create_engine

        self.sampling = MappingProxyType(dict(sampling or {}))  # the job's, for rows without their own
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_retries = max_retries
        self.engine = create_engine(engine_name, model_path, engine_kwargs=engine_kwargs,
                                    chat_template_kwargs=self.chat_template_kwargs, rows_in_flight=rows_in_flight)
        self.engine.start()
        if self.engine.retries_requests:
            self.max_retries = 0  # the engine retries each request itself; no second budget on top
        self.ready_at = time.time()  # lets the report measure throughput after engine start
        self.node_id = replica_node_id(node_id)
        self.replica = replica_id()
        if progress_board is not None:  # the driver's live ETA on the Ray path (progress_board)
            from fleetllm.batch.execution.progress_board import Reporter

            self._reporter = Reporter(progress_board, self.replica or self.node_id, self.ready_at, self.engine)

    def __call__(self, batch):
        started = time.time()
        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else list(batch)
        todo, requests = [], []
        for i, row in enumerate(rows):
            if row.get("error"):
                continue
            try:
                requests.append(request_from_row(row, self.chat_template_kwargs, self.sampling))
                todo.append(i)
            except (FleetError, ValueError, TypeError) as exc:
                row["error"] = f"invalid row: {exc}"
        order = adapter_order(requests)
        todo, requests = [todo[k] for k in order], [requests[k] for k in order]
        results, attempts = generate_with_retries(self.engine.generate, requests, self.max_retries)
        finished = time.time()
        n_max = max([int(r.sampling.get("n") or 1) for r in requests] or [1])
        done = {i: (res, att, req.structured) for i, res, att, req in zip(todo, results, attempts, requests)}
        structured = any(req.structured is not None for req in requests)
        run = stamp(self.node_id, self.replica, self.ready_at, started, finished)
        out = []
        for i, row in enumerate(rows):
            if structured:
                row["parsed"] = None  # the column exists in a structured batch even when no row parsed
            if i in done:
                res, att, constraint = done[i]
                row.update(result_columns(res, att, n_max, constraint))
            else:
                row.update({"generated_text": None, "num_input_tokens": 0, "num_generated_tokens": 0,
                            "finish_reason": None, "attempts": 0})
                if n_max > 1:
                    row["completions"] = []
            row.pop("_prompt_token_ids", None)  # used; not carried back through Ray
            row["_cached_tokens"] = done[i][0].num_cached_tokens if i in done else None
            row[RUN] = run
            out.append(row)
        return table_from_rows(out)
