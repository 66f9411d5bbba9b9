"""OpenAI Batch API files: read request lines, write `output.jsonl` and `errors.jsonl`.

Input line:  {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body"}
Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body": <chat.completion>}, "error"}
Every input line yields exactly one line, in output.jsonl when it succeeded, else in errors.jsonl
(with `error: {code, message}`), so a batch moves from OpenAI to fleetllm without changing a file.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)


def sampling_from_body(body: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    sampling = dict(defaults)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        sampling["max_tokens"] = int(max_tokens)
    for key in ("temperature", "top_p", "seed", "n"):
        if body.get(key) is not None:
            sampling[key] = body[key]
    stop = body.get("stop")
    if stop is not None:
        sampling["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("top_logprobs") is not None:
        sampling["logprobs"] = int(body["top_logprobs"])
    elif isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool):
        sampling["logprobs"] = body["logprobs"]
    for key in ("response_format", "structured_outputs"):  # a structured-output constraint (fleetllm.structured)
        if body.get(key) is not None:
            sampling[key] = body[key]
    return sampling


class OpenAIBatchPreprocessor:
    """Turn a Batch API request line into `messages`/`prompt` + `sampling_params`, or an `error`."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        self.defaults = {k: v for k, v in defaults.items() if k in ("max_tokens", "temperature", "top_p", "n")}

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        row = dict(row)
        row["error"] = row.pop("_input_error", None)
        custom_id = row.get("custom_id")
        row["row_id"] = str(custom_id) if custom_id is not None else f"{row.get('_file')}:{row['_line']}"
        row.setdefault("sampling_params", json.dumps(self.defaults))
        if row["error"] is not None:
            return row
        try:
            body = json.loads(row["body"]) if isinstance(row.get("body"), str) else row.get("body")
            self._check(row, body)
            if row["url"] == CHAT_URL:
                row["messages"] = [dict(m) for m in body["messages"]]
            else:
                prompt = body["prompt"]
                row["prompt"] = prompt if isinstance(prompt, str) else "".join(prompt)
            row["sampling_params"] = json.dumps(sampling_from_body(body, self.defaults))
        except (ValueError, TypeError, KeyError) as exc:
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


def _request_id(custom_id: str) -> str:
    return hashlib.sha256(str(custom_id).encode()).hexdigest()[:24]


def batch_line(row: dict[str, Any]) -> dict[str, Any]:
    """One output line; a row whose text failed its structured-output check (an error beside a generated
    text) goes to errors.jsonl with code `invalid_output`, its response kept."""
    custom_id = row.get("custom_id")
    rid = _request_id(row.get("row_id") or custom_id)
    if row.get("error") and row.get("generated_text") is None:
        return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": None,
                "error": {"code": "invalid_request" if row.get("attempts", 0) == 0 else "generation_failed",
                          "message": row["error"]}}
    body = json.loads(row["body"]) if isinstance(row.get("body"), str) else (row.get("body") or {})
    completions = row.get("completions") or [{"index": 0, "text": row["generated_text"],
                                              "finish_reason": row["finish_reason"]}]
    usage = {"prompt_tokens": row["num_input_tokens"], "completion_tokens": row["num_generated_tokens"],
             "total_tokens": row["num_input_tokens"] + row["num_generated_tokens"]}
    created = int(time.time())
    if row.get("url") == CHAT_URL:
        choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                    "finish_reason": c["finish_reason"], "logprobs": None} for c in completions]
        payload = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created,
                   "model": body.get("model"), "choices": choices, "usage": usage}
    else:
        choices = [{"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None}
                   for c in completions]
        payload = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created,
                   "model": body.get("model"), "choices": choices, "usage": usage}
    error = {"code": "invalid_output", "message": row["error"]} if row.get("error") else None
    return {"id": f"batch_req_{rid}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": rid, "body": payload}, "error": error}


class OpenAIBatchWriter:
    """Shard parts hold Batch output lines; finalize splits them into output.jsonl / errors.jsonl."""

    ext = "jsonl"

    def write(self, fh, table) -> None:
        for row in table.to_pylist():
            fh.write((json.dumps(batch_line(row), ensure_ascii=False) + "\n").encode())

    def finalize(self, out, plan) -> None:
        from fleetllm.batch.io import write_atomic

        entries = sorted(out.read_manifest().values(), key=lambda e: e.shard)

        def _route(want_errors: bool):
            def _write(fh):
                for entry in entries:
                    with out.fs.open(out.p(entry.file), "rb") as part:
                        for line in part:
                            if (json.loads(line)["error"] is not None) == want_errors:
                                fh.write(line)
            return _write

        write_atomic(out.fs, out.p("output.jsonl"), _route(False))
        write_atomic(out.fs, out.p("errors.jsonl"), _route(True))
