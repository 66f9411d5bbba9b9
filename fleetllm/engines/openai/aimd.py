"""AIMD concurrency controller: how many requests to keep in flight against an endpoint.

A pure class (no I/O, no asyncio, an injected clock) so that its behaviour is unit-tested exactly.
The window of in-flight requests

- starts at `initial_window` and, until the first congestion signal or until latency starts to
  rise (halfway to the tolerance, like TCP HyStart), grows by `slow_start_increase` per success
  (slow start: doubling per round trip by default);
- then grows additively, by `additive_increase / window` per success (about +1 per round trip),
  while requests succeed and latency holds;
- shrinks multiplicatively by `backoff_factor` on 429, 503/504 and timeouts, and by
  tolerance / latency-ratio (bounded by `backoff_factor` and `latency_backoff_factor`) when both
  the smoothed latency and the answer's own latency are above `latency_tolerance` times the
  observed baseline: queueing grows with the window past capacity, so the cut is deeper the
  higher latency has risen. vLLM signals overload by queueing requests, not by answering 429
  (NVIDIA-NeMo/DataDesigner#634), so latency is the signal that keeps the window near the
  server's capacity; 429 only catches a hard limit;
- after a latency cut, when latency is back near its baseline, returns at slow-start speed to
  `latency_backoff_factor` x the window before the cut (a cut caused by a client stall costs little);
- shrinks at most once per round trip: a signal from a request sent before the last decrease was
  caused by the old window and is ignored (as in TCP);
- honours Retry-After: no new request is sent before the time the server named;
- stays between `min_window` (floor) and `max_window` (ceiling).

The controller knows nothing about the server's capacity: the baseline latency is learned from
the responses (the minimum of the smoothed latency seen so far).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AIMDConfig(BaseModel):
    """Settings of the AIMD controller (one controller per engine instance / ai_query actor)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        True, description="Adapt the window; false keeps it fixed at initial_window (static concurrency)."
    )
    initial_window: int = Field(8, ge=1, description="In-flight requests at start.")
    min_window: int = Field(1, ge=1, description="Floor: the window never shrinks below this.")
    max_window: int = Field(256, ge=1, description="Ceiling: the window never grows above this.")
    slow_start: bool = Field(
        True, description="Until the first congestion signal, grow by one per success (doubling per round trip)."
    )
    slow_start_increase: float = Field(
        1.0, gt=0, le=1, description="Slow-start growth per success (1: doubling per round trip, 0.5: x1.5)."
    )
    additive_increase: float = Field(
        1.0, gt=0, description="Window growth per round trip of successes (added as increase/window per success)."
    )
    backoff_factor: float = Field(
        0.5, gt=0, lt=1, description="Window multiplier on 429, 503/504 or a timeout."
    )
    latency_backoff_factor: float = Field(
        0.9, gt=0, lt=1,
        description="Largest window multiplier when latency rises above latency_tolerance x baseline; the cut "
        "is tolerance/ratio (deeper the higher the latency), never below backoff_factor.",
    )
    latency_tolerance: float = Field(
        2.0, gt=1, description="Overload when smoothed latency exceeds this multiple of the baseline latency."
    )
    latency_smoothing: float = Field(
        0.1, gt=0, le=1, description="Weight of a new latency sample in the exponential moving average."
    )
    latency_per_token: bool = Field(
        True,
        description="Divide latency by completion tokens (when the server reports usage), so rows of "
        "different output lengths compare.",
    )
    min_latency_samples: int = Field(
        8, ge=1, description="Samples needed before the latency signal can shrink the window."
    )
    use_latency: bool = Field(True, description="Shrink on rising latency (false: only on 429/503/timeouts).")
    max_pause_s: float = Field(60.0, ge=0, description="Cap on a Retry-After pause, in seconds.")

    @model_validator(mode="after")
    def _bounds(self) -> "AIMDConfig":
        if self.min_window > self.max_window:
            raise ValueError(
                f"min_window ({self.min_window}) is above max_window ({self.max_window}); "
                "make the floor at most the ceiling"
            )
        return self


def slow_start_exit_ratio(config: AIMDConfig) -> float:
    """Latency ratio that ends slow start: halfway to the overload tolerance (as TCP HyStart does)."""
    return 1.0 + (config.latency_tolerance - 1.0) / 2.0


class Signal(str, enum.Enum):
    """Why the window shrank."""

    RATE_LIMIT = "rate_limit"  # 429
    UNAVAILABLE = "unavailable"  # 503 / 504
    TIMEOUT = "timeout"
    LATENCY = "latency"


@dataclass(frozen=True)
class Ticket:
    """One in-flight request: when it was sent."""

    sent_at: float


@dataclass
class AIMDStats:
    sent: int = 0
    successes: int = 0
    decreases: dict[str, int] = field(default_factory=dict)
    ignored_signals: int = 0
    max_limit: int = 0


class AIMDController:
    """The window of in-flight requests; see the module docstring for the rules.

    Use: `t = c.try_acquire()` (None: wait, see `pause_remaining()`), send, then exactly one of
    `on_success(t, latency_s, tokens)`, `on_overload(t, signal, retry_after_s)`, `on_other(t)`.
    """

    def __init__(self, config: AIMDConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or AIMDConfig()
        self.clock = clock
        c = self.config
        self.window: float = float(min(max(c.initial_window, c.min_window), c.max_window))
        self.in_flight = 0
        self.paused_until = float("-inf")
        self.last_decrease_at = float("-inf")
        self.in_slow_start = c.slow_start and c.enabled
        self.smoothed_latency: float | None = None
        self.baseline_latency: float | None = None
        self.latency_samples = 0
        self.recover_to: float | None = None
        self.stats = AIMDStats(max_limit=self.limit)

    # --- the window -------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """Most requests that may be in flight now."""
        return max(self.config.min_window, min(self.config.max_window, int(self.window)))

    def pause_remaining(self) -> float:
        """Seconds until Retry-After allows new sends (0 when not paused)."""
        return max(0.0, self.paused_until - self.clock())

    def can_send(self) -> bool:
        return self.in_flight < self.limit and self.pause_remaining() == 0.0

    def try_acquire(self) -> Ticket | None:
        """A ticket for one request, or None when the window is full or a Retry-After pause holds."""
        if not self.can_send():
            return None
        self.in_flight += 1
        self.stats.sent += 1
        return Ticket(sent_at=self.clock())

    # --- outcomes ---------------------------------------------------------------------------

    def on_success(self, ticket: Ticket, latency_s: float, completion_tokens: int | None = None) -> None:
        """A request succeeded after `latency_s` seconds."""
        self._release()
        self.stats.successes += 1
        self.on_sample(ticket, latency_s, completion_tokens)

    def on_sample(self, ticket: Ticket, latency_s: float, completion_tokens: int | None = None) -> None:
        """A latency sample that grows or cuts the window as a success does, releasing nothing: a request of
        other traffic that shares the server (fleetllm.serve.batch_admission feeds interactive requests' latency
        to the window of Batch API rows), with `ticket` saying when it was sent."""
        if not self.config.enabled:
            return
        overloaded = self._observe_latency(latency_s, completion_tokens)
        if self.in_slow_start and self._latency_ratio() > slow_start_exit_ratio(self.config):
            self.in_slow_start = False  # latency starts rising: stop doubling, keep the window
        if overloaded and self.config.use_latency:
            self._decrease(ticket, Signal.LATENCY)
        elif not overloaded:
            self._increase()

    def on_overload(self, ticket: Ticket, signal: Signal, retry_after_s: float | None = None) -> None:
        """The server said it is overloaded (429, 503/504) or the request timed out."""
        self._release()
        if retry_after_s is not None and retry_after_s > 0:
            pause = min(float(retry_after_s), self.config.max_pause_s)
            self.paused_until = max(self.paused_until, self.clock() + pause)
        if self.config.enabled:
            self._decrease(ticket, signal)

    def on_quiet(self) -> None:
        """No latency sample for a while (the traffic it came from stopped): grow as after a success."""
        if self.config.enabled:
            self._increase()

    def on_other(self, ticket: Ticket) -> None:
        """A failure that says nothing about load (400, 401, connection refused...): only release."""
        self._release()

    # --- internals --------------------------------------------------------------------------

    def _release(self) -> None:
        if self.in_flight <= 0:
            raise RuntimeError("AIMDController: more releases than acquires")
        self.in_flight -= 1

    def _observe_latency(self, latency_s: float, completion_tokens: int | None) -> bool:
        """Fold a sample into the moving average; True when both the average and this sample are
        above the tolerance (a single slow answer, or the average still high from answers that
        came before the last cut, does not shrink the window)."""
        c = self.config
        sample = float(latency_s)
        if c.latency_per_token and completion_tokens:
            sample /= max(1, int(completion_tokens))
        if self.smoothed_latency is None:
            self.smoothed_latency = sample
        else:
            self.smoothed_latency += c.latency_smoothing * (sample - self.smoothed_latency)
        self.latency_samples += 1
        if self.latency_samples < c.min_latency_samples:
            return False
        if self.baseline_latency is None or self.smoothed_latency < self.baseline_latency:
            self.baseline_latency = self.smoothed_latency
        limit = c.latency_tolerance * self.baseline_latency
        return self.smoothed_latency > limit and sample > limit

    def _latency_ratio(self) -> float:
        """Smoothed latency over its baseline (1.0 before the baseline is known)."""
        if self.baseline_latency is None or self.smoothed_latency is None or self.baseline_latency <= 0:
            return 1.0
        return self.smoothed_latency / self.baseline_latency

    def _increase(self) -> None:
        c = self.config
        fast_return = (self.recover_to is not None and self.window < self.recover_to
                       and self._latency_ratio() <= slow_start_exit_ratio(c))
        if self.in_slow_start or fast_return:
            self.window += c.slow_start_increase
        else:
            self.window += c.additive_increase / max(self.window, 1.0)
        self.window = min(self.window, float(c.max_window))
        if self.recover_to is not None and self.window >= self.recover_to:
            self.recover_to = None
        self.stats.max_limit = max(self.stats.max_limit, self.limit)

    def _decrease(self, ticket: Ticket, signal: Signal) -> None:
        c = self.config
        if ticket.sent_at < self.last_decrease_at:
            self.stats.ignored_signals += 1  # sent under the old window: already answered
            return
        if signal is Signal.LATENCY:
            # Cut in proportion to the excess latency (queueing grows with the window past the
            # server's capacity), between backoff_factor and latency_backoff_factor.
            factor = min(c.latency_backoff_factor, max(c.backoff_factor, c.latency_tolerance / self._latency_ratio()))
            # If latency comes back to its baseline, return fast to where a gentle cut would
            # have landed: a cut caused by a stall (a busy client, a GC pause) costs little.
            self.recover_to = self.window * c.latency_backoff_factor
        else:
            factor = c.backoff_factor
            self.recover_to = None  # 429/503/timeouts are hard evidence: additive growth only
        self.window = max(float(c.min_window), self.window * factor)
        self.in_slow_start = False
        self.last_decrease_at = self.clock()
        self.stats.decreases[signal.value] = self.stats.decreases.get(signal.value, 0) + 1

    def snapshot(self) -> dict[str, object]:
        """State for logs and benchmarks."""
        return {
            "window": round(self.window, 3),
            "limit": self.limit,
            "in_flight": self.in_flight,
            "baseline_latency_s": self.baseline_latency,
            "smoothed_latency_s": self.smoothed_latency,
            "sent": self.stats.sent,
            "successes": self.stats.successes,
            "decreases": dict(self.stats.decreases),
            "ignored_signals": self.stats.ignored_signals,
            "max_limit": self.stats.max_limit,
        }
