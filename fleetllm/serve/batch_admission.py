"""Admission of Batch API rows from the interactive latency (issue 34): batch work fills spare capacity.

Batch rows already run after interactive requests at the engine (priority 1, vLLM's priority scheduling),
but every batch row in an engine batch still lengthens each decode step, so a full batch window raises the
interactive inter-token latency. Here the API holds batch rows back before the engine: the rows one API
process lets into the engines form an AIMD window (fleetllm.engines.openai.aimd, the controller the batch
client and `ai_query` use) whose latency signal is the *interactive* requests' latency per output token
(TTFT included), sampled as each finishes:

- the window grows while interactive latency holds near its baseline (the best seen), or while no
  interactive request finished in the last `quiet_s` seconds (nothing to protect);
- it is cut when the smoothed interactive latency rises past `latency_tolerance` x that baseline;
- a batch row that finds the window full waits in the API (never an error): its client's own AIMD window
  sees the longer latency and sends less.

The signal (FLEETLLM_BATCH_ADMISSION_SIGNAL, an A/B knob while the GPU figures decide, issue 34 #3):
`token_latency` (default) as above; `gap_p99`, the 99th percentile of the gaps between chunks over the last
GAP_POOL gaps of all streamed interactive requests (the inter-token tail the Batch API's must-show bounds,
pooled as a benchmark pools it; one request's 256 gaps hold too few for a 99th percentile) against the best
seen, sampled as each streamed request finishes once GAP_MIN gaps are pooled. The mean per token held ITL p50
at the tolerance and the batch below the sequences where throughput stops growing (docs/batch-api.md, lease
15); the pooled tail lets the mean rise while the tail holds. Non-streamed interactive requests give no gaps:
under `gap_p99` they only mark interactive traffic as present. The gaps start at the first token: TTFT is left
to the engine's priority order (lease 15: 0.88x of alone).

The baseline is the best latency seen, and it can be one the batch cannot give back: an interactive load alone in
lock-step waves (equal lengths, closed loop: its prompts prefill together between decode runs) has a lower p99 gap
than the same load arriving spread out, as it does beside any batch (its own prefill chunks land in other streams'
decode steps). Lease 20 (H100): after such a baseline the batch drew ~50 and ~550 tokens/s in two 30-second legs
(~1 and ~7 rows decoding at a time) and committed no shard. So once the window has held its floor (no more batch
rows in the engines than the floor) while FLOOR_SAMPLES samples came (under `gap_p99` also a whole pool of new gaps)
and the interactive latency is still past the tolerance, that latency is the interactive traffic's own: it becomes
the baseline, and the window grows again from there.

One gate per API process and model: on the direct path that is each replica (its own engine), behind the
separate ingress each ingress replica over the model's replicas.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import time
from typing import Any, AsyncIterator, Callable, Sequence

from fleetllm.batches.store import BATCH_HEADER
from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController, Ticket

BATCH_PRIORITY = 1  # the engine priority of batch rows (lower runs first, as vLLM orders them; interactive 0)

# The tolerance the Batch API promises interactive traffic (its must-show: within 1.25x of alone).
DEFAULT_TOLERANCE = 1.25
DEFAULT_MAX_WINDOW = 1024
SIGNALS = ("token_latency", "gap_p99")
GAP_POOL = 2000  # the interactive chunk gaps the p99 is taken over (~1 s of 8 streams at 5 ms a token)
GAP_MIN = 200  # no sample before this many gaps: the 99th percentile of fewer is one outlier
FLOOR_SAMPLES = 10  # samples at the floor before its latency is taken as the baseline (smoothing 0.2 forgets 0.9)


def checked_signal(signal: str, source: str = "admission signal") -> str:
    """`signal` if it is one of SIGNALS, else a ValueError naming `source` and the choices."""
    if signal not in SIGNALS:
        raise ValueError(f"{source} {signal!r} is not a signal; use one of {', '.join(SIGNALS)}")
    return signal


def signal_from_env() -> str:
    """FLEETLLM_BATCH_ADMISSION_SIGNAL (default token_latency), checked."""
    value = os.environ.get("FLEETLLM_BATCH_ADMISSION_SIGNAL", "token_latency").strip() or "token_latency"
    return checked_signal(value, "FLEETLLM_BATCH_ADMISSION_SIGNAL")


def gaps_of(times: Sequence[float]) -> list[float]:
    """The gaps between consecutive times."""
    return [b - a for a, b in zip(times, times[1:])]


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile (nearest rank) of `values`; None for fewer than 2."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return None
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def admission_config(max_window: int = DEFAULT_MAX_WINDOW, tolerance: float = DEFAULT_TOLERANCE,
                     signal: str = "token_latency") -> AIMDConfig:
    """The window's settings: the signal's latency (per token, or a p99 gap as it is), cuts of 0.8 to 0.5
    (deeper the higher latency rose)."""
    return AIMDConfig(initial_window=min(16, max_window), max_window=max_window, latency_tolerance=tolerance,
                      latency_backoff_factor=0.8, backoff_factor=0.5, latency_per_token=signal == "token_latency",
                      min_latency_samples=8, latency_smoothing=0.2)


def is_batch(request: Any) -> bool:
    """A Batch API row (the batch service marks its requests with the batch's id)."""
    return bool(request.headers.get(BATCH_HEADER))


def priority_of(request: Any) -> int:
    """The engine priority of a request: batch rows after interactive ones."""
    return BATCH_PRIORITY if is_batch(request) else 0


class BatchAdmission:
    """The window of batch rows in the engines of one model, driven by interactive latency (module doc)."""

    def __init__(self, config: AIMDConfig | None = None, quiet_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, signal: str = "token_latency") -> None:
        self.signal = checked_signal(signal)
        self.window = AIMDController(config or admission_config(signal=signal), clock=clock)
        self.quiet_s = quiet_s
        self.clock = clock
        self.last_interactive = float("-inf")
        self.waiting = 0
        self.gaps: collections.deque[float] = collections.deque(maxlen=GAP_POOL)  # gap_p99's pool
        self.at_floor: list[int] | None = None  # [samples, gaps] since the window came to its floor (rows included)
        self.rebaselines = 0
        self._changed = asyncio.Event()

    # --- pure part (no waiting): what the unit tests drive -----------------------------------------------

    def try_admit(self) -> Ticket | None:
        """A slot for one batch row, or None while the window is full."""
        return self.window.try_acquire()

    def done(self, ticket: Ticket) -> None:
        """A batch row left the engine; with no interactive traffic lately, the window grows."""
        self.window.on_other(ticket)
        if self.clock() - self.last_interactive > self.quiet_s:
            self.window.on_quiet()
        self._changed.set()

    def interactive(self, sent_at: float, latency_s: float, output_tokens: int | None,
                    gaps: Sequence[float] | None = None) -> None:
        """An interactive request sent at `sent_at` finished after `latency_s` with `output_tokens`; a streamed
        one gives the gaps between its chunks (pooled under `gap_p99`)."""
        self.last_interactive = self.clock()
        if self.signal == "token_latency":
            self.window.on_sample(Ticket(sent_at=sent_at), latency_s, output_tokens)
        elif gaps:
            self.gaps.extend(gaps)
            if len(self.gaps) >= GAP_MIN:
                self.window.on_sample(Ticket(sent_at=sent_at), p99(self.gaps))
        self._settle_floor(len(gaps or ()))
        self._changed.set()

    def _settle_floor(self, new_gaps: int) -> None:
        """Past the tolerance with the window held at its floor over FLOOR_SAMPLES samples (and, under
        `gap_p99`, a pool of gaps all taken there): the latency is not the batch's, it becomes the baseline."""
        w, floor = self.window, self.window.config.min_window
        if w.limit > floor or w.in_flight > floor:
            self.at_floor = None
            return
        if self.at_floor is None:
            self.at_floor = [0, 0]
            return
        self.at_floor[0] += 1
        self.at_floor[1] += new_gaps
        settled = self.at_floor[0] >= FLOOR_SAMPLES and (self.signal != "gap_p99" or self.at_floor[1] >= GAP_POOL)
        base, latest = w.baseline_latency, w.smoothed_latency
        if settled and base and latest and latest > w.config.latency_tolerance * base:
            w.baseline_latency = latest
            self.rebaselines += 1
            self.at_floor = [0, 0]

    def snapshot(self) -> dict[str, object]:
        return {**self.window.snapshot(), "waiting": self.waiting, "rebaselines": self.rebaselines}

    # --- asyncio part ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one place in the window for a batch row (waits while it is full)."""
        ticket = self.try_admit()
        self.waiting += 1
        try:
            while ticket is None:
                self._changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):  # re-check now and then: quiet growth
                    await asyncio.wait_for(self._changed.wait(), timeout=0.25)
                if self.clock() - self.last_interactive > self.quiet_s and self.window.in_flight == 0:
                    self.window.on_quiet()  # nothing in flight, nothing interactive: open up
                ticket = self.try_admit()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.done(ticket)
