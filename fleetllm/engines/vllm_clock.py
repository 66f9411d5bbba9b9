"""A vLLM `generate` call's clock, from vLLM's own per-request statistics (RequestOutput.metrics, kept
while the engine runs with disable_log_stats False): when each request's first token came and its last.
A call whose requests all ran the same number of steps (the calibration probe's calls of forced lengths)
then reads as a static batch: its prefill until the last request's first token, then `steps - 1` decode
steps of all its sequences, so the probe's fit tells a step's cost from the prefill's
(fleetllm.estimate.observe.split_call), as the transformers engine's step clock does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fleetllm.engines.base import GenerateTiming, GenerationResult


@dataclass(frozen=True)
class RequestMark:
    """One request's engine-core timestamps (monotonic seconds) and its prompt tokens."""

    first_token_at: float
    last_token_at: float
    prompt_tokens: int


def request_mark(metrics: Any, prompt_tokens: int) -> RequestMark | None:
    """vLLM's RequestStateStats as a mark; None without its timestamps (another vLLM's metrics)."""
    first, last = getattr(metrics, "first_token_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
    return RequestMark(first, last, prompt_tokens) if first and last else None


def call_timing(marks: Sequence[RequestMark | None], results: Sequence[GenerationResult]) -> GenerateTiming | None:
    """The call's clock when every request has a mark and one completion and all ran the same number of tokens
    (at least two: a decode step to time); else None (outputs of different lengths leave the engine's batch
    at different steps: not a static batch)."""
    if not marks or len(marks) != len(results) or any(m is None for m in marks):
        return None
    if any(r.error or len(r.completions) != 1 for r in results):
        return None
    steps = {r.num_generated_tokens for r in results}
    if len(steps) != 1 or (n := steps.pop()) < 2:
        return None
    prompt = round(sum(m.prompt_tokens for m in marks) / len(marks))
    return GenerateTiming(len(marks), prompt, n, max(m.first_token_at for m in marks),
                         max(m.last_token_at for m in marks))
