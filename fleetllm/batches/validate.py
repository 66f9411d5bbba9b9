"""Validation of a batch's input file at create, as OpenAI does it: before anything runs, every line is
read; a problem makes the batch `failed` with `errors.data` naming the line (1-based) and the reason.

Limits (OpenAI's): 50,000 requests and 200 MB per batch file. One model per file (OpenAI's rule too);
every line's `url` is the batch's `endpoint`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
MAX_ERRORS = 100  # errors.data lists at most this many problems (the first ones)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


@dataclass
class Validation:
    total: int = 0
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)

    def add(self, code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


def validate_lines(lines: Iterable[bytes], size: int, endpoint: str, served: dict[str, str]) -> Validation:
    """Check a batch file. `served`: model id -> task ("generate" | "embed") of the models this server serves."""
    v = Validation()
    if size > MAX_BYTES:
        v.add("file_too_large", f"the input file has {size:,} bytes; a batch file holds at most {MAX_BYTES:,} "
              "bytes (200 MB): split it into several batches")
        return v
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        v.total += 1
        if v.total > MAX_REQUESTS:
            v.add("too_many_requests", f"the input file has more than {MAX_REQUESTS:,} requests; a batch holds at "
                  "most 50,000: split it into several batches", line=n)
            return v
        check_line(v, n, raw, endpoint, served, seen)
    if v.total == 0:
        v.add("empty_file", "the input file has no requests; upload a JSONL file with one request per line")
    return v


def check_line(v: Validation, n: int, raw: bytes, endpoint: str, served: dict[str, str],
               seen: dict[str, int]) -> None:
    try:
        row = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        v.add("invalid_json_line", f"line {n} is not valid JSON ({exc}); write one JSON object per line", line=n)
        return
    if not isinstance(row, dict):
        v.add("invalid_json_line", f"line {n} is a JSON {type(row).__name__}, not an object", line=n)
        return
    custom_id = row.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        v.add("missing_custom_id", f"line {n} has no custom_id (a non-empty string)", line=n, param="custom_id")
    elif custom_id in seen:
        v.add("duplicate_custom_id", f"line {n} repeats custom_id {custom_id!r} of line {seen[custom_id]}; each "
              "request needs its own custom_id", line=n, param="custom_id")
    else:
        seen[custom_id] = n
    if row.get("method") != "POST":
        v.add("invalid_method", f"line {n} has method {row.get('method')!r}; batch requests use POST", line=n,
              param="method")
    if row.get("url") != endpoint:
        v.add("invalid_url", f"line {n} has url {row.get('url')!r}, but this batch's endpoint is {endpoint!r}; "
              "every line's url must be the batch's endpoint", line=n, param="url")
    body = row.get("body")
    if not isinstance(body, dict):
        v.add("invalid_body", f"line {n} has no `body` object", line=n, param="body")
        return
    check_model(v, n, body.get("model"), endpoint, served)


def check_model(v: Validation, n: int, model: Any, endpoint: str, served: dict[str, str]) -> None:
    if model not in served:
        v.add("model_not_found", f"line {n} asks for model {model!r}, which this server does not serve (it serves "
              f"{sorted(served)})", line=n, param="body.model")
        return
    if v.model is None:
        v.model = model
    elif model != v.model:
        v.add("mismatched_model", f"line {n} asks for model {model!r} but line 1's model is {v.model!r}; a batch "
              "file uses one model", line=n, param="body.model")
        return
    want = "embed" if endpoint == "/v1/embeddings" else "generate"
    if served[model] != want:
        v.add("model_not_supported", f"model {model!r} serves {served[model]}, not {endpoint}", line=n,
              param="body.model")
