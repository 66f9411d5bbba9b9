"""The batch engine stage with engine openai against the capacity server: one retry budget, and the
`attempts` column counting HTTP requests."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from fleetllm.batch.execution.stages import EngineStage
from fleetllm.errors import EndpointError
from fleetllm.testing.capacity_server import CapacityServer


def batch(n: int, prefix: str = "row") -> pa.Table:
    return pa.Table.from_pylist([{"row_id": str(i), "error": None, "sampling_params": json.dumps({"max_tokens": 8}),
                                  "messages": [{"role": "user", "content": f"{prefix} {i}"}]} for i in range(n)])


def stage(base_url: str, engine_retries: int, compute_retries: int) -> EngineStage:
    return EngineStage("openai", "capacity-test", {"base_url": base_url, "max_retries": engine_retries,
                                                   "retry": {"initial_backoff_s": 0.001, "max_backoff_s": 0.002}},
                       max_retries=compute_retries)


def run_stage(n: int, engine_retries: int, compute_retries: int, **server) -> tuple[EngineStage, list, dict]:
    """One stage call of n rows against a fresh capacity server: (stage, output rows, server stats)."""
    with CapacityServer(**server) as srv:
        s = stage(srv.base_url, engine_retries=engine_retries, compute_retries=compute_retries)
        try:
            rows = s(batch(n)).to_pylist()
        finally:
            s.engine.stop()
        return s, rows, srv.stats()


def test_a_failing_endpoint_costs_engine_retries_plus_one_never_a_product():
    # An endpoint failing every request (503) is its own failure: the stage raises, no row is written
    # (fleetllm.engines.openai.failures.endpoint_wide), and each row was sent max_retries + 1 times.
    with CapacityServer(capacity=4, latency_s=0.001, failure_rate=1.0) as srv:
        s = stage(srv.base_url, engine_retries=2, compute_retries=3)
        try:
            with pytest.raises(EndpointError, match="is unavailable to every request \\(HTTP 503.*on all 3 attempts"):
                s(batch(5))
            time.sleep(0.3)  # the batch's other rows end their retries
        finally:
            s.engine.stop()
        stats = srv.stats()
    assert s.max_retries == 0  # the engine retries requests itself; the stage adds none
    assert stats["requests"] == 5 * 3 and set(stats["prompts"].values()) == {3}


def test_attempts_column_counts_the_http_requests_of_each_row():
    _, rows, stats = run_stage(60, 20, 2, capacity=8, latency_s=0.001, failure_rate=0.3, seed=3)
    assert [r["generated_text"] for r in rows] == [f"echo: row {i}" for i in range(60)]
    assert [r["attempts"] for r in rows] == [stats["prompts"][f"row {i}"] for i in range(60)]
    assert any(r["attempts"] > 1 for r in rows)


def test_an_engine_that_raises_records_the_error_on_every_row_once():
    with CapacityServer(capacity=4, latency_s=0.001) as srv:
        s = stage(srv.base_url, engine_retries=2, compute_retries=3)
        s.engine.stop()  # the engine's loop is gone: generate raises for the whole batch
        rows = s(batch(3)).to_pylist()
        assert srv.stats()["requests"] == 0
    assert all(r["error"].startswith("engine error after 1 attempt: ") and "not started" in r["error"] for r in rows)
