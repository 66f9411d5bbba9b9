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
"""

from __future__ import annotations

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


def new_trace() -> StreamTrace | NoTrace:
    """A trace for one stream where FLEETLLM_STREAM_TRACE is set, else one that records nothing."""
    if TRACE_DIR is None:
        return NoTrace()
    Path(TRACE_DIR).mkdir(parents=True, exist_ok=True)
    return StreamTrace(TRACE_DIR)
