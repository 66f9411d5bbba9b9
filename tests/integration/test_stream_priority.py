"""The transformers engine's streaming queue is ordered by priority (interactive 0 before Batch API rows 1):
with one row per engine batch, an interactive request queued behind batch rows runs before them."""

from __future__ import annotations

import asyncio

import pytest

from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = TransformersEngine(tiny_model, engine_kwargs={"max_model_len": 256, "max_batch_size": 1,
                                                        "batch_wait_s": 0.0})
    eng.start()
    yield eng
    eng.stop()


def test_interactive_request_overtakes_queued_batch_rows(engine):
    finished: list[str] = []

    async def run(name: str, priority: int, delay: float, tokens: int = 24) -> None:
        await asyncio.sleep(delay)
        req = GenerationRequest(prompt=f"{name} says", sampling={"max_tokens": tokens, "ignore_eos": True},
                                request_id=name, priority=priority)
        async for _ in engine.generate_stream(req):
            pass
        finished.append(name)

    async def main():
        # "first" occupies the engine (long enough that a loaded machine still queues the others behind it);
        # three batch rows queue, then one interactive request behind them
        await asyncio.gather(run("first", 1, 0.0, tokens=200), run("b1", 1, 0.05), run("b2", 1, 0.06), run("b3", 1, 0.07),
                             run("interactive", 0, 0.1))

    asyncio.run(main())
    assert finished[0] == "first" and finished[1] == "interactive", finished
    assert finished[2:] == ["b1", "b2", "b3"]  # batch rows keep their arrival order
