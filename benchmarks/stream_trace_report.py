"""Where a served token waits: the gaps and hop delays of FLEETLLM_STREAM_TRACE files (fleetllm.serve.stream_trace).

    python benchmarks/stream_trace_report.py TRACE_DIR [--from MONO --to MONO] [--json R.json]

Per stream, from the replica's own clock (time.monotonic, shared by every process of the machine):
- engine gap: between two engine outputs of one stream (vLLM's step cadence as fleetllm receives it)
- out gap: between two messages leaving the replica's ModelServer (what the SSE writer is handed)
- engine -> loop: an output's wait from the engine's event loop to the serving event loop (a thread hop)
- loop -> out: a delta's wait in ModelServer before the message that carries it leaves (the stream budget's
  merging, and the serving loop's other work)
Set beside the client's ITL: a p99 gap the client sees and `out` does not is added after ModelServer (the
SSE writer, Ray Serve, the HTTP proxy); one `out` shows and `engine` does not is added in the replica.
And from the replica's loop-trace files (LoopWatch): the serving loop's stalls of 5 ms or more and the garbage
collections of 0.5 ms or more in the window (a stall the collections do not explain was other work on the loop).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def records(folder: str | Path, pattern: str):
    """Each JSON line of the folder's files matching pattern (a line cut by a killed server skipped)."""
    for path in sorted(Path(folder).glob(pattern)):
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def within(t: float, start: float | None, end: float | None) -> bool:
    return (start is None or t >= start) and (end is None or t <= end)


def load(folder: str | Path, start: float | None = None, end: float | None = None) -> list[dict]:
    """Streams whose first delta reached the serving loop within [start, end] (monotonic seconds)."""
    return [s for s in records(folder, "stream-trace-*.jsonl") if s.get("loop") and within(s["loop"][0], start, end)]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def summarize(streams: list[dict]) -> dict:
    """Percentiles in ms of each gap and hop over all streams (the first delta of a stream has no gap)."""
    engine, out, hop, wait = [], [], [], []
    for s in streams:
        eng = [t for t in s["engine"] if t >= 0]
        engine += gaps(eng)
        out += gaps([t for t, _ in s["out"]])
        hop += [b - a for a, b in zip(s["engine"], s["loop"]) if a >= 0]
        sent = iter(s["out"])  # each delta leaves with the first message at or after its arrival
        cur = next(sent, None)
        for t in s["loop"]:
            while cur is not None and cur[0] < t:
                cur = next(sent, None)
            if cur is not None:
                wait.append(cur[0] - t)
    row = {"streams": len(streams), "deltas": sum(len(s["loop"]) for s in streams),
           "messages": sum(len(s["out"]) for s in streams)}
    for name, vals in (("engine_gap", engine), ("out_gap", out), ("engine_to_loop", hop), ("loop_to_out", wait)):
        for q in (50, 99):
            v = pct(vals, q)
            row[f"{name}_p{q}_ms"] = round(v * 1000, 2) if v is not None else None
        row[f"{name}_max_ms"] = round(max(vals) * 1000, 2) if vals else None
    long_out = [g for g in out if g > 0.015]
    row["out_gaps_over_15ms"] = len(long_out)
    row["engine_gaps_over_15ms"] = sum(1 for g in engine if g > 0.015)
    row["engine_gaps_over_20ms_by_token_index"] = by_token_index(streams, 0.020)
    row["first_token_groups"] = first_token_groups(streams)
    return row


INDEX_BUCKETS = ((1, 1), (2, 7), (8, 31), (32, 10**9))


def count_by_token_index(indices: list[int]) -> dict:
    """Gaps counted by where in its stream each fell (the gap before token i, i = 1 right after the first), in
    INDEX_BUCKETS: a stream decoding while later prompts prefill waits at its first tokens. Also serve_gpu.py's
    client `long_gaps`."""
    return {f"{a}" if a == b else (f"{a}+" if b >= 10**9 else f"{a}-{b}"): sum(1 for i in indices if a <= i <= b)
            for a, b in INDEX_BUCKETS}


def by_token_index(streams: list[dict], over_s: float) -> dict:
    """The engine gaps over `over_s` by where in its stream each fell (count_by_token_index)."""
    return count_by_token_index([i + 1 for s in streams
                                 for i, g in enumerate(gaps([t for t in s["engine"] if t >= 0])) if g > over_s])


def bursts(times: list[float], within_s: float) -> int:
    """How many bursts the moments form (one within `within_s` of the previous joins its burst). Also
    serve_client_stats.py's client-side waves."""
    times = sorted(times)
    return sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > within_s)


def first_token_groups(streams: list[dict], within_s: float = 0.010) -> int:
    """How many engine steps gave streams their first token (first outputs within `within_s` of the previous one
    count as one step): the prefill steps the streams' prompts were spread over."""
    return bursts([s["engine"][0] for s in streams if s["engine"] and s["engine"][0] >= 0], within_s)


def loop_summary(folder: str | Path, start: float | None = None, end: float | None = None) -> dict:
    """The serving loops' stalls and the garbage collections that began within [start, end] (monotonic s), in ms."""
    stalls, pauses = [], []
    for rec in records(folder, "loop-trace-*.jsonl"):
        stalls += [ms for t, ms in rec.get("stalls", []) if within(t, start, end)]
        pauses += [(gen, ms) for t, gen, ms in rec.get("gc", []) if within(t, start, end)]
    gc_ms = [ms for _, ms in pauses]
    return {"loop_stalls": len(stalls), "loop_stall_p50_ms": pct(stalls, 50),
            "loop_stall_max_ms": max(stalls, default=None),
            "loop_stalled_ms": round(sum(stalls), 1), "loop_stalls_over_15ms": sum(1 for ms in stalls if ms > 15),
            "gc_pauses": len(pauses), "gc_max_ms": max(gc_ms, default=None), "gc_ms": round(sum(gc_ms), 1),
            "gc_gen2": sum(1 for gen, _ in pauses if gen == 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--from", dest="start", type=float, default=None)
    p.add_argument("--to", dest="end", type=float, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    row = {**summarize(load(a.folder, a.start, a.end)), **loop_summary(a.folder, a.start, a.end)}
    for k, v in row.items():
        print(f"{k:28s} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
