"""Per-token timestamps of served streams, for finding where a streamed token waits (issue 36's tail).

Off unless FLEETLLM_STREAM_TRACE names a folder. Then each replica process appends one JSON line per
finished stream to `<folder>/stream-trace-<pid>.jsonl`, every time `time.monotonic()` of that process:

    engine   when each engine output reached fleetllm on the engine's event loop (StreamDelta.emitted_at)
    loop     when the same delta reached the serving event loop (ModelServer's pump)
    out      [time, deltas] when a message left ModelServer for the API's SSE writer (after the stream
             budget's merging), and how many deltas it carried

`benchmarks/stream_trace_report.py` turns the folder into the gaps and hop delays, to set beside the
client's inter-token latency: a gap the client sees that `out` does not show was added after the replica
(Ray Serve, the HTTP proxy); one that `out` shows and `engine` does not was added inside it.

Beside them, `<folder>/loop-trace-<pid>.jsonl` (LoopWatch): each stall of the serving loop of 5 ms or more (a
task that woke late: the loop, or the interpreter's lock, was held by other work) and each garbage collection of
0.5 ms or more in the process, with its generation: whether a gap the engine did not make is the loop's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path

TRACE_DIR = os.environ.get("FLEETLLM_STREAM_TRACE") or None


class StreamTrace:
    """One stream's timestamps; `write()` appends them to the process's trace file."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.engine: list[float] = []
        self.loop: list[float] = []
        self.out: list[list[float]] = []

    def delta(self, emitted_at: float | None) -> None:
        self.engine.append(round(emitted_at, 6) if emitted_at is not None else -1.0)
        self.loop.append(round(time.monotonic(), 6))

    def sent(self, deltas: int) -> None:
        self.out.append([round(time.monotonic(), 6), deltas])

    def write(self) -> None:
        path = Path(self.folder) / f"stream-trace-{os.getpid()}.jsonl"
        with path.open("a") as f:  # one short line per stream; a diagnostic, so written on the loop
            f.write(json.dumps({"engine": self.engine, "loop": self.loop, "out": self.out}) + "\n")


class NoTrace:
    """What a stream records when tracing is off: nothing."""

    def delta(self, emitted_at: float | None) -> None:
        pass

    def sent(self, deltas: int) -> None:
        pass

    def write(self) -> None:
        pass


class LoopWatch:
    """The serving loop's stalls and the process's garbage collections, appended to the trace folder each second
    (module doc). A task sleeps TICK_S at a time and records how late it woke; the collector's callbacks time
    each collection, whichever thread ran it (the interpreter's lock held meanwhile)."""

    TICK_S, STALL_S, GC_MIN_S = 0.002, 0.005, 0.0005

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / f"loop-trace-{os.getpid()}.jsonl"
        self.stalls: list[list[float]] = []  # [when the sleep began, how late it woke (ms)]
        self.pauses: list[list[float]] = []  # [when the collection began, generation, ms]
        self._gc_began: float | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task:
        gc.callbacks.append(self.on_gc)
        return loop.create_task(self.watch())

    def on_gc(self, phase: str, info: dict) -> None:
        now = time.monotonic()
        if phase == "start":
            self._gc_began = now
        elif self._gc_began is not None:
            if now - self._gc_began >= self.GC_MIN_S:
                self.pauses.append([round(self._gc_began, 6), info.get("generation", -1),
                                    round((now - self._gc_began) * 1e3, 3)])
            self._gc_began = None

    async def watch(self) -> None:
        try:
            flushed = time.monotonic()
            while True:
                began = time.monotonic()
                await asyncio.sleep(self.TICK_S)
                now = time.monotonic()
                if now - began - self.TICK_S >= self.STALL_S:
                    self.stalls.append([round(began, 6), round((now - began - self.TICK_S) * 1e3, 3)])
                if now - flushed >= 1.0:
                    self.flush()
                    flushed = now
        finally:
            gc.callbacks.remove(self.on_gc)
            self.flush()

    def flush(self) -> None:
        if self.stalls or self.pauses:
            stalls, pauses, self.stalls, self.pauses = self.stalls, self.pauses, [], []
            with self.path.open("a") as f:
                f.write(json.dumps({"stalls": stalls, "gc": pauses}) + "\n")


_WATCHED: dict[int, asyncio.Task] = {}  # id(loop) -> its LoopWatch task: one per serving loop of the process


def new_trace() -> StreamTrace | NoTrace:
    """A trace for one stream where FLEETLLM_STREAM_TRACE is set, else one that records nothing. The first one on
    a loop starts that loop's LoopWatch."""
    if TRACE_DIR is None:
        return NoTrace()
    Path(TRACE_DIR).mkdir(parents=True, exist_ok=True)
    loop = asyncio.get_running_loop()
    if id(loop) not in _WATCHED or _WATCHED[id(loop)].done():
        _WATCHED[id(loop)] = LoopWatch(TRACE_DIR).start(loop)
    return StreamTrace(TRACE_DIR)
