"""OpenAI Batch API lines: the urls a line may name, a line's body -> the engine's sampling dict, an
embeddings body -> its inputs, a finished row -> its output line.

Input line:  {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings",
              "body"}
Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body": <chat.completion>}, "error"}
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from fleetllm.errors import validation_problems

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
EMBEDDINGS_BODY_KEYS = ("model", "input", "encoding_format", "dimensions", "user")


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

    from fleetllm.engines.openai_api.embeddings import EmbeddingsRequest

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
        from fleetllm.engines.openai_api.embeddings import embeddings_response

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
    from fleetllm.engines.openai_api.logprobs import chat_logprobs, completion_logprobs

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
