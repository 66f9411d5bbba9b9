"""The admission window of Batch API rows (fleetllm.serve.batch_admission) with an injected clock: it grows
while interactive latency holds or no interactive request finishes, is cut when interactive latency rises,
and a batch row past the window waits (never fails) until a place frees."""

from __future__ import annotations

import asyncio

from fleetllm.serve.batch_admission import BatchAdmission, admission_config


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def gate(**kw) -> tuple[BatchAdmission, Clock]:
    clock = Clock()
    return BatchAdmission(admission_config(**kw), quiet_s=2.0, clock=clock), clock


def interactive(g: BatchAdmission, clock: Clock, n: int, per_token_s: float, tokens: int = 100,
                p99_s: float | None = None) -> None:
    """n interactive requests of `tokens` at `per_token_s`; streamed ones (p99_s) give their gaps too: one in
    fifty at p99_s (2% of the gaps: the pool's 99th percentile), the rest such that the mean stays per_token_s."""
    for _ in range(n):
        sent = clock.t
        clock.t += per_token_s * tokens
        gaps = None
        if p99_s is not None:
            slow = tokens // 50
            fast = (per_token_s * tokens - slow * p99_s) / (tokens - slow)
            gaps = [p99_s if i % 50 == 49 else fast for i in range(tokens)]
        g.interactive(sent, per_token_s * tokens, tokens, gaps)


def test_steady_interactive_latency_opens_the_window():
    g, clock = gate(max_window=64)
    start = g.window.limit
    interactive(g, clock, 40, 0.005)
    assert g.window.limit > start


def test_rising_interactive_latency_cuts_the_window():
    g, clock = gate(max_window=64)
    interactive(g, clock, 40, 0.005)  # the baseline: 5 ms a token
    before = g.window.limit
    interactive(g, clock, 10, 0.005 * 1.6)  # 1.6x: past the 1.25 tolerance
    assert g.window.limit < before
    assert g.window.stats.decreases.get("latency", 0) >= 1


def test_latency_within_tolerance_does_not_cut():
    g, clock = gate(max_window=64)
    interactive(g, clock, 40, 0.005)
    interactive(g, clock, 20, 0.005 * 1.1)
    assert not g.window.stats.decreases


def test_batch_rows_grow_the_window_only_when_interactive_traffic_is_quiet():
    g, clock = gate(max_window=64)
    interactive(g, clock, 10, 0.005)
    size = g.window.window
    ticket = g.try_admit()
    g.done(ticket)  # an interactive request finished just now: no growth from batch rows
    assert g.window.window == size
    clock.t += 5.0  # quiet for longer than quiet_s
    ticket = g.try_admit()
    g.done(ticket)
    assert g.window.window > size


def test_a_full_window_holds_a_batch_row_until_a_place_frees():
    async def main() -> list[str]:
        g = BatchAdmission(admission_config(max_window=1), quiet_s=3600.0)
        g.last_interactive = g.clock()  # interactive traffic now: no quiet growth
        order: list[str] = []
        release = asyncio.Event()

        async def row(name: str, hold: asyncio.Event | None) -> None:
            async with g.slot():
                order.append(f"{name} in")
                if hold is not None:
                    await hold.wait()
                order.append(f"{name} out")

        first = asyncio.create_task(row("a", release))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(row("b", None))
        await asyncio.sleep(0.3)
        assert g.waiting == 1 and order == ["a in"]  # b waits while a holds the only place
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), timeout=5)
        return order

    assert asyncio.run(main()) == ["a in", "a out", "b in", "b out"]


def test_p99_is_the_nearest_rank_of_the_gaps():
    from fleetllm.serve.batch_admission import gaps_of, p99

    assert p99(gaps_of([0.0, 1.0, 2.0, 3.0, 13.0])) == 10.0  # gaps 1, 1, 1, 10: the 99th percentile is the worst
    times = [i * 0.005 for i in range(201)]
    times[100:] = [t + 0.02 for t in times[100:]]  # one 25 ms gap among 200: above the 99th percentile's rank
    assert abs(p99(gaps_of(times)) - 0.005) < 1e-9
    assert p99(gaps_of([1.0, 2.0])) is None  # one gap says nothing about a tail


def test_under_gap_p99_the_tail_is_pooled_over_requests_before_it_is_a_sample():
    from fleetllm.serve.batch_admission import GAP_MIN

    g = BatchAdmission(admission_config(max_window=64, signal="gap_p99"), clock=Clock(), signal="gap_p99")
    g.interactive(g.clock.t, 0.5, 100, [0.005] * 99 + [0.050])  # one request's worst gap is no p99 yet
    assert g.window.smoothed_latency is None
    for _ in range(GAP_MIN // 100):
        g.interactive(g.clock.t, 0.5, 100, [0.005] * 100)
    assert g.window.smoothed_latency == 0.005  # 1 slow gap in 300: under the 99th percentile of the pool


def test_under_gap_p99_the_window_follows_the_tail_not_the_mean():
    mean = BatchAdmission(admission_config(max_window=64), clock=Clock())
    tail = BatchAdmission(admission_config(max_window=64, signal="gap_p99"), clock=Clock(), signal="gap_p99")
    for g in (mean, tail):
        interactive(g, g.clock, 40, 0.005, p99_s=0.010)  # baseline: 5 ms a token, worst gaps 10 ms
        interactive(g, g.clock, 10, 0.005 * 1.6, p99_s=0.011)  # the mean rises 1.6x, the tail 1.1x
    assert mean.window.stats.decreases.get("latency", 0) >= 1
    assert not tail.window.stats.decreases
    interactive(tail, tail.clock, 30, 0.008, p99_s=0.010 * 1.6)  # now the (pooled) tail rises past the tolerance
    assert tail.window.stats.decreases.get("latency", 0) >= 1


def test_under_gap_p99_a_request_without_gaps_marks_traffic_but_gives_no_sample():
    g = BatchAdmission(admission_config(max_window=64, signal="gap_p99"), clock=Clock(), signal="gap_p99")
    g.interactive(g.clock.t, 0.5, 100, None)  # not streamed: no gaps
    assert g.window.stats.successes == 0 and g.window.smoothed_latency is None
    assert g.last_interactive == g.clock.t  # interactive traffic is present: batch rows do not grow the window


def test_an_unknown_admission_signal_is_refused_naming_the_choices(monkeypatch):
    import pytest

    from fleetllm.serve.batch_admission import signal_from_env

    monkeypatch.setenv("FLEETLLM_BATCH_ADMISSION_SIGNAL", "p99")
    with pytest.raises(ValueError, match="token_latency, gap_p99"):
        signal_from_env()
    monkeypatch.setenv("FLEETLLM_BATCH_ADMISSION_SIGNAL", "gap_p99")
    assert signal_from_env() == "gap_p99"
    with pytest.raises(ValueError, match="token_latency, gap_p99"):
        BatchAdmission(signal="p99")


def _at_the_floor_after_a_lock_step_baseline(later_p99_s: float) -> BatchAdmission:
    """A gap_p99 gate whose baseline came from a lock-step load alone (worst gaps 7 ms), then batch rows and
    interactive worst gaps of `later_p99_s` until the window is at its floor and its rows have left."""
    g = BatchAdmission(admission_config(max_window=64, signal="gap_p99"), clock=Clock(), signal="gap_p99")
    interactive(g, g.clock, 30, 0.005, p99_s=0.007)
    tickets = [g.try_admit() for _ in range(g.window.limit)]
    interactive(g, g.clock, 30, 0.006, p99_s=0.0126)  # 1.8x: cut and cut again
    for t in tickets:
        g.done(t)
    assert g.window.limit == 1 and g.window.in_flight == 0
    interactive(g, g.clock, 35, 0.006, p99_s=later_p99_s)  # a new pool of gaps at the floor, no batch row running
    return g


def test_a_tail_the_floor_cannot_bring_back_becomes_the_baseline_and_the_window_reopens():
    g = _at_the_floor_after_a_lock_step_baseline(0.0126)  # spread-out arrivals: the load's own prefill steps
    assert g.rebaselines == 1
    assert abs(g.window.baseline_latency - g.window.smoothed_latency) < 0.002
    interactive(g, g.clock, 20, 0.006, p99_s=0.0126)
    assert g.window.limit > 1  # the batch runs again, cut only past 1.25x of the new baseline
    assert g.snapshot()["rebaselines"] == 1


def test_a_tail_that_comes_back_at_the_floor_keeps_its_baseline():
    g = _at_the_floor_after_a_lock_step_baseline(0.007)  # the batch was the cause: at the floor the tail is back
    assert g.rebaselines == 0
    assert g.window.baseline_latency <= 0.0071


def test_rows_still_in_the_engine_keep_the_baseline():
    g = BatchAdmission(admission_config(max_window=64, signal="gap_p99"), clock=Clock(), signal="gap_p99")
    interactive(g, g.clock, 30, 0.005, p99_s=0.007)
    tickets = [g.try_admit() for _ in range(g.window.limit)]
    interactive(g, g.clock, 60, 0.006, p99_s=0.0126)  # the window at its floor, its earlier rows still running
    assert g.window.limit == 1 and g.window.in_flight > 1
    assert g.rebaselines == 0
    for t in tickets:
        g.done(t)


def test_under_token_latency_a_heavier_interactive_load_becomes_the_baseline_at_the_floor():
    g, clock = gate(max_window=64)
    interactive(g, clock, 30, 0.005)
    tickets = [g.try_admit() for _ in range(g.window.limit)]
    interactive(g, clock, 30, 0.009)  # 1.8x a token: the window cut to its floor
    for t in tickets:
        g.done(t)
    assert g.window.limit == 1 and g.rebaselines == 0
    interactive(g, clock, 12, 0.009)  # more interactive users, not the batch: the floor changes nothing
    assert g.rebaselines == 1 and g.window.baseline_latency > 0.008
