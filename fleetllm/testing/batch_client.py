"""Helpers for tests and benchmarks of the Batch API: request lines, upload + create, polling, reading files,
all through the official openai client."""

from __future__ import annotations

import json
import time
from typing import Any

FINAL = ("completed", "failed", "cancelled", "expired")


def chat_lines(n: int, model: str, max_tokens: int = 8, prefix: str = "r") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "messages": [{"role": "user", "content": f"Count from {i} to {i + 3}."}],
                      "max_tokens": max_tokens, "temperature": 0}} for i in range(n)]


def document_lines(docs: int, questions: int, model: str = "m", max_tokens: int = 3, seed: int = 0) -> list[dict]:
    """Lines sharing prompt prefixes: each document asked `questions` questions (custom_id d<doc>q<question>),
    as chat lines (some with content parts, some with their message keys in another order) and, for every
    third document, completions lines; shuffled, so the lines of one document are spread over the file."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma"]
    texts = [f"Document {d}. " + " ".join(rng.choice(words) for _ in range(80)) for d in range(docs)]
    lines = []
    for d in range(docs):
        for q in range(questions):
            ask = f"What is word {q} of document {d}?"
            if d % 3 == 2:
                url = "/v1/completions"
                body = {"model": model, "prompt": f"{texts[d]}\n{ask}", "max_tokens": max_tokens, "seed": q}
            else:
                user = ({"content": [{"type": "text", "text": texts[d]}, {"type": "text", "text": f"\n{ask}"}],
                         "role": "user"} if q % 2 else {"role": "user", "content": f"{texts[d]}\n{ask}"})
                url, body = "/v1/chat/completions", {
                    "model": model, "messages": [{"role": "system", "content": "Answer briefly."}, user],
                    "max_tokens": max_tokens, "temperature": 0}
            lines.append({"custom_id": f"d{d}q{q}", "method": "POST", "url": url, "body": body})
    rng.shuffle(lines)
    return lines


def jsonl(lines: list[Any]) -> bytes:
    return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines).encode() + b"\n"


def submit(client, lines: list[Any], endpoint: str = "/v1/chat/completions", window: str = "24h",
           metadata: dict[str, str] | None = None):
    """Upload `lines` (dicts, or raw strings for broken lines) and create a batch over them."""
    f = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window=window,
                                 metadata=metadata)


def wait_for(client, batch_id: str, until=FINAL, timeout_s: float = 300, poll_s: float = 0.5,
             done: int | None = None):
    """Poll until the batch's status is in `until` (or, with `done`, until that many requests completed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until or (done is not None and batch.request_counts.completed >= done):
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} ({batch.request_counts}) after {timeout_s}s")
        time.sleep(poll_s)


def read_lines(client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]
