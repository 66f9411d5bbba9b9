"""Engine logprob entries ({token, logprob, top_logprobs}) in OpenAI's response shapes: what the server
answers and what an OpenAI Batch output line holds (fleetllm.serve.protocol, fleetllm.batch.openai_batch)."""

from __future__ import annotations

from typing import Any


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Engine logprob entries -> OpenAI chat `logprobs: {content: [...]}`."""
    if not entries:
        return None
    return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode()),
                         "top_logprobs": [{"token": t["token"], "logprob": t["logprob"],
                                           "bytes": list(t["token"].encode())} for t in e.get("top_logprobs", [])]}
                        for e in entries]}


def completion_logprobs(entries: list[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
    """Engine logprob entries -> legacy completions `logprobs` (tokens, token_logprobs, top_logprobs, text_offset:
    each token's start in the choice's text, from `offset`). As vLLM and OpenAI answer, each top_logprobs holds
    the chosen token too; an echoed prompt's first token has null logprob and top_logprobs."""
    if not entries:
        return None
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None if e.get("logprob") is None else
                             {**{t["token"]: t["logprob"] for t in e.get("top_logprobs") or []},
                              e["token"]: e["logprob"]} for e in entries],
            "text_offset": offsets}
