"""What the benchmark client's own clock says about a serving run (`vllm bench serve --save-detailed`'s per-request
start times, TTFTs and gaps): where the long gaps fell in their streams, and whether the load stayed in waves."""

from __future__ import annotations

from stream_trace_report import bursts, count_by_token_index

LONG_GAP_MS = 20.0


def long_gaps(itls: list[list[float]], over_ms: float = LONG_GAP_MS) -> dict:
    """The client's gaps over `over_ms` (vLLM's bench reports seconds): how many, their share of all gaps, and
    where in its stream each fell (the gap before token i, i = 1 right after the first): a stream that decodes
    while later prompts prefill waits at its first tokens, one held by the server's own path anywhere."""
    gaps = [(i + 1, g * 1000) for x in itls for i, g in enumerate(x)]
    long = [i for i, ms in gaps if ms > over_ms]
    return {"over_ms": over_ms, "count": len(long), "share": round(len(long) / len(gaps), 4) if gaps else None,
            "by_token_index": count_by_token_index(long)}


def waves(starts: list[float], ttfts: list[float]) -> dict:
    """Whether the load stayed in waves, from the client's own clock: bursts of requests sent (a new request goes
    out as one ends: a wave whose streams end in one engine step sends together) and bursts of first tokens (the
    engine steps that finished the waves' prefills). More first-token steps per wave: the prompts reached the
    engine spread out, and every stream that already decodes waits out each later prefill step."""
    sent = bursts(starts, 0.020)
    firsts = bursts([s + t for s, t in zip(starts, ttfts) if t], 0.010)
    return {"send_bursts": sent, "first_token_steps": firsts,
            "steps_per_burst": round(firsts / sent, 2) if sent else None}
