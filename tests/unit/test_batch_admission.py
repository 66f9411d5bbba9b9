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


def interactive(g: BatchAdmission, clock: Clock, n: int, per_token_s: float, tokens: int = 100) -> None:
    for _ in range(n):
        sent = clock.t
        clock.t += per_token_s * tokens
        g.interactive(sent, per_token_s * tokens, tokens)


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
