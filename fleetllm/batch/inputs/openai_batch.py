"""OpenAI Batch API files: read request lines, write `output.jsonl` and `errors.jsonl`.

Input line:  {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings",
              "body"}
Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body": <chat.completion>}, "error"}
A file's lines share one url family: embeddings lines make the job an embed job (`file_task`), and a
file mixing embeddings with chat/completions lines is refused before anything runs.
Every input line yields exactly one line, in output.jsonl when it succeeded, else in errors.jsonl
(with `error: {code, message}`), so a batch moves from OpenAI to fleetllm without changing a file.
"""

from __future__ import annotations

import json
from typing import Any

from fleetllm.engines.images import image_parts
from fleetllm.engines.openai_api.batch_lines import (  # noqa: F401 - the line format, re-exported for the batch code
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    URLS,
    batch_line,
    embeddings_inputs,
    line_adapter,
    sampling_from_body,
)
from fleetllm.errors import FleetError


def file_task(path: str, declared: str = "openai_batch") -> str:
    """"embed" when the input's lines have url /v1/embeddings, else "generate"; InputError for a file
    (or folder) mixing embeddings lines with chat/completions lines, naming where each kind is."""
    from fleetllm.batch.inputs.discovery import list_files, open_input
    from fleetllm.errors import InputError

    first: dict[str, str] = {}
    fs, entries = list_files(path, declared)
    for p, rel in entries:
        with open_input(fs, fs._strip_protocol(p)) as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    url = json.loads(line).get("url")
                except (ValueError, AttributeError):
                    continue  # a broken line becomes that row's error later
                kind = "embed" if url == EMBEDDINGS_URL else "generate"
                first.setdefault(kind, f"{rel} line {n} (url {url})")
    if len(first) > 1:
        raise InputError(f"the OpenAI Batch input mixes embeddings and generation lines: {first['embed']} and "
                         f"{first['generate']}; a job runs one task with one model, so split the file by url")
    return next(iter(first), "generate")


class OpenAIBatchPreprocessor:
    """Turn a Batch API request line into `messages`/`prompt` + `sampling_params`, or an `error`."""

    def __init__(self, defaults: dict[str, Any], task: str = "generate", adapters: tuple[str, ...] = (),
                 images: bool = False) -> None:
        self.defaults = dict(defaults)  # the job's `sampling`: every line's defaults, its body overrides them
        self.task = task
        self.adapters = tuple(adapters)  # model.lora_adapters: a line whose body.model names one uses it
        # image parts are kept (a local VLM's image stage fetches them, an endpoint gets them), else refused
        self.images = images

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        row["error"] = row.pop("_input_error", None)
        custom_id = row.get("custom_id")
        line = row.get("_source_line", row["_line"])  # a grouped shard's row (batch.planning.prefix): its own line
        row["row_id"] = str(custom_id) if custom_id is not None else f"{row.get('_file')}:{line}"
        row.setdefault("sampling_params", json.dumps(self.defaults))
        if row["error"] is not None:
            return row
        try:
            body = json.loads(row["body"]) if isinstance(row.get("body"), str) else row.get("body")
            self._check(row, body)
            if (row["url"] == EMBEDDINGS_URL) != (self.task == "embed"):
                raise ValueError(f"url {row['url']} does not match this job's task ({self.task}); "
                                 "a file holds either embeddings lines or chat/completions lines")
            if row["url"] == EMBEDDINGS_URL:
                row["_embed_inputs"], row["_embed_dimensions"] = embeddings_inputs(body)
                return row
            row["_adapter"] = line_adapter(body.get("model"), self.adapters)
            if row["url"] == CHAT_URL and self.images and image_parts(body["messages"]):  # as they are, in JSON
                row["_messages"] = json.dumps(body["messages"], ensure_ascii=False)
            elif row["url"] == CHAT_URL:
                from fleetllm.engines.chat import text_content  # text parts joined; other parts refused

                row["messages"] = [{**m, "content": text_content(m.get("content"), f"body.messages[{i}].content")}
                                   if isinstance(m, dict) else m for i, m in enumerate(body["messages"])]
            else:
                prompt = body["prompt"]
                row["prompt"] = prompt if isinstance(prompt, str) else "".join(prompt)
            row["sampling_params"] = json.dumps(sampling_from_body(body, self.defaults, row["url"] == CHAT_URL))
        except (ValueError, TypeError, KeyError, FleetError) as exc:
            row["error"] = str(exc)
        return row

    @staticmethod
    def _check(row: dict[str, Any], body: Any) -> None:
        if row.get("custom_id") is None:
            raise ValueError("the line has no custom_id")
        if row.get("method", "POST") != "POST":
            raise ValueError(f"method {row.get('method')!r} is not supported; use POST")
        if row.get("url") not in URLS:
            raise ValueError(f"url {row.get('url')!r} is not supported; use one of {list(URLS)}")
        if not isinstance(body, dict):
            raise ValueError("the line has no `body` object")
        if row["url"] == CHAT_URL and not body.get("messages"):
            raise ValueError("body.messages is missing or empty")
        if row["url"] == COMPLETIONS_URL and not body.get("prompt"):
            raise ValueError("body.prompt is missing or empty")


class OpenAIBatchWriter:
    """Shard parts hold Batch output lines; finalize splits them into output.jsonl / errors.jsonl."""

    ext = "jsonl"

    def write(self, fh, table) -> None:
        for row in table.to_pylist():
            fh.write((json.dumps(batch_line(row), ensure_ascii=False) + "\n").encode())

    def finalize(self, out, plan) -> None:
        entries = sorted(out.committed(plan.shards, plan.fingerprint).values(), key=lambda e: e.shard)

        def _route(want_errors: bool):
            def _write(fh):
                for entry in entries:
                    with out.fs.open(out.p(entry.file), "rb") as part:
                        for line in part:
                            if (json.loads(line)["error"] is not None) == want_errors:
                                fh.write(line)
            return _write

        out.write_file("output.jsonl", _route(False))
        out.write_file("errors.jsonl", _route(True))
