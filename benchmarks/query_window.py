"""Does a batch replica keep its AIMD window full? `fleetllm query`'s path against the capacity server.

`fleetllm query` / `fleetllm run` with engine openai hand each replica batches of compute.batch_size
rows; the engine sends a batch's rows under its AIMD window and the call returns when the whole
batch is done. Ray Data runs the batches of one block (a shard) one after the other, and up to
compute.batches_in_flight calls (blocks) at once per replica. So a replica never has more than
about min(batches_in_flight, its shards) x min(batch_size, shard_rows) requests in flight, whatever
its window. This script measures that, side by side in one run, through the real runner
(fleetllm.batch.runner.run_job, 1 replica) against the capacity-limited server in a subprocess
(the server of benchmarks/aimd.py: C=32 hidden, 300 ms, +50% at a full batch), and against the
same engine sending all rows in one call (the AIMD client alone, no batching: the reference).

    PYTHONPATH=. python benchmarks/query_window.py    # prints a table, writes benchmarks/results/query_window.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "query_window.json"
SERVER = dict(capacity=32, latency_s=0.3, batch_slowdown=0.5)
MODEL = "bench/capacity-test"  # the served id (org/name shaped: also resolves as a hub id on older runners)
# (label, batch_size, shard_rows, batches_in_flight)
CONFIGS = [
    ("batch 4, shards of 300", 4, 300, "auto"),
    ("batch 64, one batch at a time", 64, 300, 1),
    ("batch 64, shards of 300", 64, 300, "auto"),
    ("batch 300 = shard_rows", 300, 300, "auto"),
]


def reference(rows: int) -> dict:
    """The engine alone: every row in one generate call (the window is the only limit)."""
    from fleetllm.engines.base import GenerationRequest, create_engine
    from fleetllm.testing.capacity_server import CapacityServer

    with CapacityServer(subprocess=True, model=MODEL, **SERVER) as srv:
        engine = create_engine("openai", MODEL, engine_kwargs={"base_url": srv.base_url})
        engine.start()
        try:
            t0 = time.monotonic()
            results = engine.generate([GenerationRequest(messages=[{"role": "user", "content": f"question {i}"}],
                                                         sampling={"max_tokens": 8}) for i in range(rows)])
            seconds = time.monotonic() - t0
            window = engine.controller.snapshot()
        finally:
            engine.stop()
        stats = srv.stats()
    return {"label": "engine alone, all rows in one call", "seconds": seconds, "rows_per_s": rows / seconds,
            "errors": sum(r.error is not None for r in results), "bound": None,
            "mean_in_flight": stats["in_system_s"] / stats["span_s"], "max_in_flight": stats["max_in_system"],
            "429s": stats["rate_limited"], "max_window": window["max_limit"]}


def job_point(rows: int, label: str, batch_size: int, shard_rows: int, in_flight, workdir: Path) -> dict:
    from fleetllm.sizing import batches_in_flight
    from fleetllm.batch.runner import run_job
    from fleetllm.spec import JobSpec
    from fleetllm.testing.capacity_server import CapacityServer

    src = workdir / "in.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"id": i, "q": f"question {i}"}) + "\n" for i in range(rows)))
    with CapacityServer(subprocess=True, model=MODEL, **SERVER) as srv:
        spec = JobSpec.model_validate({
            "name": label, "model": {"source": MODEL, "engine": "openai", "engine_kwargs": {"base_url": srv.base_url}},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{q}"},
            "sampling": {"max_tokens": 8}, "output": {"path": str(workdir / f"out-{time.time_ns()}"),
                                                      "shard_rows": shard_rows},
            "compute": {"replicas": 1, "batch_size": batch_size, "batches_in_flight": in_flight,
                        "cpus_per_replica": 0.5}})
        report = run_job(spec)
        stats = srv.stats()
    calls = batches_in_flight("openai", batch_size, in_flight)
    shards = -(-rows // shard_rows)
    bound = min(calls, shards) * min(batch_size, shard_rows)
    seconds = stats["span_s"]  # first request in to last reply out: the run's startup is not the endpoint's
    return {"label": label, "batch_size": batch_size, "shard_rows": shard_rows, "batches_in_flight": calls,
            "seconds": seconds, "rows_per_s": rows / seconds, "errors": report["errors"], "bound": bound,
            "mean_in_flight": stats["in_system_s"] / stats["span_s"], "max_in_flight": stats["max_in_system"],
            "429s": stats["rate_limited"], "job_wall_s": report["wall_time_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1200)
    a = p.parse_args()
    import ray

    from fleetllm.batch.execution.stream import init_ray

    t0 = time.time()
    init_ray(None, 1)
    points = [reference(a.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        for label, batch_size, shard_rows, in_flight in CONFIGS:
            points.append(job_point(a.rows, label, batch_size, shard_rows, in_flight, Path(tmp)))
    ray.shutdown()
    ref = points[0]["rows_per_s"]
    print(f"\n{a.rows} rows, server C={SERVER['capacity']} (hidden), {SERVER['latency_s'] * 1000:.0f} ms; "
          "1 replica; rows/s from first request to last reply")
    print(f"{'configuration':36} {'in-flight bound':>15} {'mean in flight':>14} {'max':>5} {'rows/s':>7} {'vs alone':>8}")
    for pt in points:
        pt["vs_engine_alone"] = pt["rows_per_s"] / ref
        bound = "-" if pt["bound"] is None else str(pt["bound"])
        print(f"{pt['label']:36} {bound:>15} {pt['mean_in_flight']:14.1f} {pt['max_in_flight']:5d} "
              f"{pt['rows_per_s']:7.1f} {pt['vs_engine_alone']:8.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"server": SERVER, "rows": a.rows, "machine": platform.platform(),
                                   "seconds": time.time() - t0, "points": points}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
