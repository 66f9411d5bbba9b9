"""Turning vLLM's CompletionOutput objects into fleetllm's Completion and logprob entries.

Plain functions over vLLM's output objects (duck-typed: token_ids, text, finish_reason, index,
logprobs), so they import nothing from vLLM.
"""

from __future__ import annotations

from typing import Any

from fleetllm.engines.base import Completion

FINISH_REASONS = ("stop", "length")


def logprob_entries(token_ids: Any, logprobs: Any, top: int | None) -> list[dict[str, Any]] | None:
    """One entry per generated token: {token, logprob, top_logprobs: [{token, logprob}] (when top > 0)}.

    `logprobs` is vLLM's per-position list of {token_id: Logprob(logprob, rank, decoded_token)}; the
    sampled token is always in it, the `top` most likely ones by rank.
    """
    if top is None or logprobs is None:
        return None
    entries: list[dict[str, Any]] = []
    for token_id, position in zip(list(token_ids), list(logprobs)):
        chosen = position.get(token_id)
        entry: dict[str, Any] = {
            "token": chosen.decoded_token if chosen is not None else None,
            "logprob": float(chosen.logprob) if chosen is not None else float("nan"),
        }
        if top:
            ranked = sorted(position.values(), key=lambda lp: lp.rank if lp.rank is not None else 1 << 30)
            entry["top_logprobs"] = [{"token": lp.decoded_token, "logprob": float(lp.logprob)}
                                     for lp in ranked[:top]]
        entries.append(entry)
    return entries


def completion_from_output(output: Any, top_logprobs: int | None) -> Completion | None:
    """A finished CompletionOutput as a Completion; None when vLLM aborted it (no stop/length)."""
    if output.finish_reason not in FINISH_REASONS:
        return None
    return Completion(
        text=output.text,
        num_generated_tokens=len(output.token_ids),
        finish_reason=output.finish_reason,
        index=output.index,
        logprobs=logprob_entries(output.token_ids, output.logprobs, top_logprobs),
    )


def prompt_logprob_entries(ids: list[int], prompt_logprobs: Any, top: int, decode: Any) -> list[dict[str, Any]]:
    """An echoed prompt's entries from vLLM's `prompt_logprobs` (None for the first token, which has no
    context, then one {token_id: Logprob} per token): the first token with null logprob and top_logprobs,
    as the transformers engine gives them (fleetllm.serve.echo). `decode` names a token vLLM left undecoded."""
    entries: list[dict[str, Any]] = [{"token": decode([ids[0]]), "logprob": None, "top_logprobs": None}]
    for token_id, entry in zip(ids[1:], logprob_entries(ids[1:], list(prompt_logprobs)[1:], top) or []):
        entry["token"] = entry["token"] if entry["token"] is not None else decode([token_id])
        entry.setdefault("top_logprobs", [])
        entries.append(entry)
    return entries


def running_tokens(llm: Any) -> tuple[int, ...] | None:
    """Output tokens generated so far by each request vLLM holds that is past its prefill: read from the
    output processor's request states (AsyncLLM.output_processor.request_states: the frontend's copy of each
    running request, updated every engine step even for FINAL_ONLY requests). None when this vLLM keeps
    them elsewhere. The dict is copied in one call (atomic under the GIL: no Python code runs while it
    is iterated), so the engine's loop may change it meanwhile."""
    try:
        states = list(llm.output_processor.request_states.values())
    except (AttributeError, RuntimeError):
        return None
    counts = []
    for state in states:
        detok = getattr(state, "detokenizer", None)
        n = detok.num_output_tokens() if detok is not None else 0
        if n > 0:
            counts.append(n)
    return tuple(counts)
