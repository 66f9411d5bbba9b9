"""Engine logprob entries ({token, logprob, top_logprobs}) in OpenAI's response shapes: what the server
answers and what an OpenAI Batch output line holds (fleetllm.engines.openai_api: protocol, batch_lines)."""

from __future__ import annotations

import math
from typing import Any

MIN_LOGPROB = -9999.0  # OpenAI's floor: a token a constraint masked has -inf, which JSON cannot carry


def _lp(value: float | None) -> float | None:
    """A logprob JSON can carry: -inf and NaN (masked by a structured-output constraint) become the floor."""
    if value is None:
        return None
    return value if math.isfinite(value) and value > MIN_LOGPROB else MIN_LOGPROB


def _token(entry: dict[str, Any]) -> str:
    return entry.get("token") or ""


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Engine logprob entries -> OpenAI chat `logprobs: {content: [...]}`."""
    if not entries:
        return None
    return {"content": [{"token": _token(e), "logprob": _lp(e["logprob"]), "bytes": list(_token(e).encode()),
                         "top_logprobs": [{"token": _token(t), "logprob": _lp(t["logprob"]),
                                           "bytes": list(_token(t).encode())} for t in e.get("top_logprobs") or []]}
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
        offset += len(_token(e))
    return {"tokens": [_token(e) for e in entries], "token_logprobs": [_lp(e["logprob"]) for e in entries],
            "top_logprobs": [None if e.get("logprob") is None else
                             {**{_token(t): _lp(t["logprob"]) for t in e.get("top_logprobs") or []},
                              _token(e): _lp(e["logprob"])} for e in entries],
            "text_offset": offsets}
