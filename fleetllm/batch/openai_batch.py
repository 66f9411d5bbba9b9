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

import hashlib
import json
import time
from typing import Any

from fleetllm.engines.images import image_parts
from fleetllm.errors import FleetError, validation_problems

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
EMBEDDINGS_BODY_KEYS = ("model", "input", "encoding_format", "dimensions", "user")


def file_task(path: str, declared: str = "openai_batch") -> str:
    """"embed" when the input's lines have url /v1/embeddings, else "generate"; InputError for a file
    (or folder) mixing embeddings lines with chat/completions lines, naming where each kind is."""
    from fleetllm.batch.discovery import list_files, open_input
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


# Body fields this file format reads itself; every other field goes through the field table
# (fleetllm.engines.fields) and is honoured by the job's engine or refused on that line.
BODY_FIELDS = ("model", "messages", "prompt", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
               "stream")


def sampling_from_body(body: dict[str, Any], defaults: dict[str, Any], chat: bool = True) -> dict[str, Any]:
    """A Batch line's body -> the engine's sampling dict. Nothing is dropped: fields other than the prompt
    and `model` (echoed in the output) become sampling fields, checked here for types and ranges, and by
    the engine for what it honours. Raises FieldError naming the field."""
    from fleetllm.engines.fields import REQUEST_FIELDS, FieldError, check_sampling

    sampling = dict(defaults)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    if body.get("stream"):
        raise FieldError("`stream: true` does not apply to a batch line; remove it", param="stream")
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if top is not None and not logprobs:
            raise FieldError("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise FieldError(f"`logprobs` must be true or false on {CHAT_URL}, got {logprobs!r}", param="logprobs")
        if logprobs:
            sampling["logprobs"] = 0 if top is None else top
    elif logprobs is not None:
        sampling["logprobs"] = logprobs
    for key, value in body.items():
        if key in BODY_FIELDS:
            continue
        if key in REQUEST_FIELDS:
            raise FieldError(f"`{key}` is not read from a batch line ({REQUEST_FIELDS[key]}); remove it", param=key)
        sampling[key] = value
    return check_sampling(sampling, None)


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
        line = row.get("_source_line", row["_line"])  # a grouped shard's row (fleetllm.batch.prefix): its own line
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


def line_adapter(model: Any, adapters: tuple[str, ...]) -> str | None:
    """The LoRA adapter a line's body.model names (`name` or `base:name`), else None (the base model)."""
    if not adapters or not isinstance(model, str):
        return None
    name = model.rpartition(":")[2]
    if name in adapters:
        return name
    if ":" in model:
        raise ValueError(f"body.model {model!r} names LoRA adapter {name!r}, which is not in model.lora_adapters "
                         f"{sorted(adapters)}")
    return None


def embeddings_inputs(body: dict[str, Any]) -> tuple[str, int | None]:
    """A /v1/embeddings body -> (JSON list of {text} / {token_ids}, dimensions); ValueError naming the problem."""
    from pydantic import ValidationError

    from fleetllm.engines.openai_embeddings import EmbeddingsRequest

    unknown = sorted(set(body) - set(EMBEDDINGS_BODY_KEYS))
    if unknown:
        raise ValueError(f"body field(s) {unknown} are not supported for /v1/embeddings; "
                         f"supported: {list(EMBEDDINGS_BODY_KEYS)}")
    try:
        req = EmbeddingsRequest.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{where}: {what}" for where, what in validation_problems(exc.errors(), root="body"))
        raise ValueError(f"invalid embeddings body: {problems}") from None
    return json.dumps(req.items()), req.dimensions


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
    if row.get("url") == EMBEDDINGS_URL:
        from fleetllm.engines.openai_embeddings import embeddings_response

        vectors = row.get("embeddings") or ([row["embedding"]] if row.get("embedding") is not None else [])
        payload = embeddings_response(body.get("model"), [list(v) for v in vectors], int(row["num_input_tokens"] or 0),
                                      body.get("encoding_format") or "float")
        return {"id": f"batch_req_{rid}", "custom_id": custom_id,
                "response": {"status_code": 200, "request_id": rid, "body": payload}, "error": None}
    completions = row.get("completions") or [{"index": 0, "text": row["generated_text"],
                                              "finish_reason": row["finish_reason"]}]
    usage = {"prompt_tokens": row["num_input_tokens"], "completion_tokens": row["num_generated_tokens"],
             "total_tokens": row["num_input_tokens"] + row["num_generated_tokens"]}
    created = int(time.time())
    from fleetllm.engines.openai_logprobs import chat_logprobs, completion_logprobs

    entries = json.loads(row["logprobs"]) if row.get("logprobs") else None  # the first completion's
    chat = row.get("url") == CHAT_URL
    first_lp = (chat_logprobs if chat else completion_logprobs)(entries)
    if chat:
        choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                    "finish_reason": c["finish_reason"], "logprobs": first_lp if c["index"] == 0 else None}
                   for c in completions]
        payload = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created,
                   "model": body.get("model"), "choices": choices, "usage": usage}
    else:
        choices = [{"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"],
                    "logprobs": first_lp if c["index"] == 0 else None} for c in completions]
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
