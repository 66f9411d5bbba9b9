"""The batch engine stage with engine openai against the capacity server: one retry budget, and the
`attempts` column counting HTTP requests."""

from __future__ import annotations

import json

import pyarrow as pa

from fleetllm.batch.stages import EngineStage
from fleetllm.testing.capacity_server import CapacityServer


def batch(n: int, prefix: str = "row") -> pa.Table:
    return pa.Table.from_pylist([{"row_id": str(i), "error": None, "sampling_params": json.dumps({"max_tokens": 8}),
                                  "messages": [{"role": "user", "content": f"{prefix} {i}"}]} for i in range(n)])


def stage(base_url: str, engine_retries: int, compute_retries: int) -> EngineStage:
    return EngineStage("openai", "capacity-test", {"base_url": base_url, "max_retries": engine_retries,
                                                   "retry": {"initial_backoff_s": 0.001, "max_backoff_s": 0.002}},
                       max_retries=compute_retries)


def test_a_failing_endpoint_costs_engine_retries_plus_one_never_a_product():
    with CapacityServer(capacity=4, latency_s=0.001, failure_rate=1.0) as srv:
        s = stage(srv.base_url, engine_retries=2, compute_retries=3)
        try:
            rows = s(batch(5)).to_pylist()
        finally:
            s.engine.stop()
        stats = srv.stats()
    assert s.max_retries == 0  # the engine retries requests itself; the stage adds none
    assert stats["requests"] == 5 * 3 and set(stats["prompts"].values()) == {3}
    assert all(r["attempts"] == 3 and r["error"].startswith("HTTP 503") and r["generated_text"] is None
               for r in rows)


def test_attempts_column_counts_the_http_requests_of_each_row():
    with CapacityServer(capacity=8, latency_s=0.001, failure_rate=0.3, seed=3) as srv:
        s = stage(srv.base_url, engine_retries=20, compute_retries=2)
        try:
            rows = s(batch(60)).to_pylist()
        finally:
            s.engine.stop()
        stats = srv.stats()
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
