"""LoopWatch (fleetllm.serve.stream_trace): a serving loop's stalls and the process's garbage collections, written to
the trace folder and summed by benchmarks/stream_trace_report.py's loop_summary."""

from __future__ import annotations

import asyncio
import gc
import json
import time

from bench_modules import benchmark_module

from fleetllm.serve.stream_trace import LoopWatch


def report_module():
    return benchmark_module("stream_trace_report")


def test_a_blocked_loop_and_a_full_collection_are_recorded_and_summed(tmp_path):
    async def scenario() -> tuple[float, float]:
        task = LoopWatch(str(tmp_path)).start(asyncio.get_running_loop())
        await asyncio.sleep(0.05)  # the watch runs: no stall while the loop is free
        began = time.monotonic()
        time.sleep(0.04)  # work that holds the loop: one stall of ~40 ms
        await asyncio.sleep(0.02)
        cycles = []
        for _ in range(200_000):  # garbage in cycles: a full collection has work to do
            a: list = []
            a.append(a)
            cycles.append(a)
        del cycles
        gc.collect()
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # cancelled: it flushes what it holds
        return began, time.monotonic()

    began, ended = asyncio.run(scenario())
    files = list(tmp_path.glob("loop-trace-*.jsonl"))
    assert len(files) == 1
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    stalls = [(t, ms) for r in records for t, ms in r["stalls"]]
    # the 40 ms block: a stall whose sleep began just before it (the collection stalls the loop too, for as long
    # as the process's heap takes: over a second in a whole-suite process)
    assert any(began - 0.01 <= t <= began + 0.01 and ms >= 30 for t, ms in stalls), (began, stalls)
    row = report_module().loop_summary(tmp_path, began - 0.01, ended)
    assert row["loop_stalls"] >= 1 and row["loop_stall_max_ms"] >= 30, row
    assert row["loop_stalls_over_15ms"] >= 1 and row["gc_pauses"] >= 1 and row["gc_gen2"] >= 1, row
    assert report_module().loop_summary(tmp_path, ended + 1, None)["loop_stalls"] == 0  # outside the window
    assert LoopWatch(str(tmp_path)).on_gc not in gc.callbacks and not any(
        getattr(cb, "__self__", None).__class__ is LoopWatch for cb in gc.callbacks)  # its callback left with it
