"""Engine calls as the model's observations (fleetllm.estimate.model.Call), from the rows a call
returned: each row's prompt tokens, cached prompt tokens and generated tokens, and the call's start
and finish. Pure.

A static-batch engine (transformers) runs a call's rows together for as many steps as its longest
output; a continuous-batching engine (vLLM) keeps several calls in flight at once, so the calls that
overlapped are read as one window at their average concurrency.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from fleetllm.engines.base import GenerateTiming
from fleetllm.estimate.model import CONTINUOUS, Call


@dataclass(frozen=True)
class RowTokens:
    prompt: int
    cached: int
    output: int  # all of the row's completions
    n: int = 1


@dataclass(frozen=True)
class CallRows:
    started: float
    finished: float
    rows: tuple[RowTokens, ...]
    replica: str | None = None


def call_from_rows(call: CallRows, batching: str) -> Call:
    """One engine call's observation."""
    seqs = [(r.prompt, r.output / max(1, r.n)) for r in call.rows for _ in range(max(1, r.n))]
    prefill = sum(max(0, r.prompt - r.cached) for r in call.rows)
    longest = max((o for _, o in seqs), default=0.0)
    seconds = call.finished - call.started
    if batching == CONTINUOUS:
        return Call(1, prefill, longest, sum(o for _, o in seqs), sum(o * (p + o / 2) for p, o in seqs), seconds)
    width = len(seqs)
    mean_prompt = sum(p for p, _ in seqs) / width if width else 0.0
    return Call(1, prefill, longest, width * longest, width * longest * (mean_prompt + longest / 2), seconds)


def split_call(call: Call, timings: Sequence[GenerateTiming]) -> list[Call]:
    """A static-batch call as its decode steps (one observation per batch clocked, from its first token to
    its last: steps of a known width and context) and the rest (prefill, the first token, the call's own
    costs): two observations whose features and seconds add up to the call's, so the fit sees a step's
    cost apart from the prefill's. The call as it is without a clock of two steps or more."""
    parts, left = [], call
    for t in timings:
        steps = t.steps - 1
        seconds = t.finished - t.first_token_at
        if steps < 1 or seconds <= 0 or seconds >= left.seconds:
            continue
        ctx = t.width * steps * (t.prompt_len + t.steps / 2)
        parts.append(Call(0, 0.0, steps, t.width * steps, ctx, seconds))
        left = Call(left.calls, left.prefill_tokens, max(0.0, left.steps - steps),
                    max(0.0, left.seq_steps - t.width * steps), max(0.0, left.ctx_steps - ctx), left.seconds - seconds)
    return [left, *parts] if parts else [call]


def window_from_calls(calls: Sequence[CallRows]) -> Call | None:
    """Overlapping calls of a continuous-batching engine as one window: its wall time, and decode
    steps at the window's average concurrency (sequences x seconds / window) plus the last one's tail."""
    if not calls:
        return None
    start = min(c.started for c in calls)
    end = max(c.finished for c in calls)
    window = end - start
    if window <= 0:
        return None
    outs = [r.output / max(1, r.n) for c in calls for r in c.rows for _ in range(max(1, r.n))]
    if not outs:
        return None
    busy = sum(len(c.rows) * (c.finished - c.started) for c in calls)
    width = max(1.0, busy / window)
    mean = sum(outs) / len(outs)
    steps = sum(outs) / width + max(0.0, max(outs) - mean)
    prompts = [r.prompt for c in calls for r in c.rows for _ in range(max(1, r.n))]
    ctx = sum(o * (p + o / 2) for p, o in zip(prompts, outs))
    prefill = sum(max(0, r.prompt - r.cached) for c in calls for r in c.rows)
    return Call(len(calls), prefill, steps, sum(outs), ctx, window)


def row_n(row: dict, default_n: int = 1) -> int:
    """Completions of a row (`n` of its own sampling_params: a dict, or JSON text as the table carries it;
    `default_n`, the job's, for a row without its own)."""
    sampling = row.get("sampling_params")
    if sampling is None:
        return default_n
    if isinstance(sampling, str):
        try:
            sampling = json.loads(sampling)
        except ValueError:
            return 1
    return int(sampling.get("n") or 1) if isinstance(sampling, dict) else 1


def output_lengths(rows: Sequence[dict], default_n: int = 1) -> list[int]:
    """Output tokens per completion of the rows without an error."""
    return [round((r.get("num_generated_tokens") or 0) / row_n(r, default_n)) for r in rows if not r.get("error")]


def group_calls(rows: Sequence[dict], default_n: int = 1) -> list[CallRows]:
    """Rows returned by the engine stage (columns `_run`: the replica's telemetry, {replica, started,
    finished, ...} (fleetllm.batch.execution.telemetry), `num_input_tokens`, `num_generated_tokens`,
    `_cached_tokens`, `n`) grouped into their calls; rows with an error are left out (they did no decoding)."""
    groups: dict[tuple, list[RowTokens]] = {}
    for row in rows:
        run = row.get("_run") or {}
        if row.get("error") or run.get("started") is None or run.get("finished") is None:
            continue
        key = (run.get("replica"), run["started"], run["finished"])
        groups.setdefault(key, []).append(RowTokens(int(row.get("num_input_tokens") or 0),
                                                    int(row.get("_cached_tokens") or 0),
                                                    int(row.get("num_generated_tokens") or 0), row_n(row, default_n)))
    return [CallRows(k[1], k[2], tuple(v), k[0]) for k, v in sorted(groups.items(), key=lambda kv: kv[0][1])]
