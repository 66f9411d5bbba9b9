"""Can a batch replica fill its AIMD window? Plan-time checks for jobs with engine openai.

In a batch job (`fleetllm query`, `fleetllm run` with engine openai) a replica's engine receives
calls of compute.batch_size rows and answers each when its slowest row is done. Ray Data runs the
batches of one block (a shard, or several when batch_size > shard_rows) one after another, and up
to compute.batches_in_flight calls at once per replica. So a replica never has more than

    batches_in_flight x min(batch_size, shard_rows)

requests in flight (fewer when it has fewer shards to work on than batches_in_flight), whatever
its AIMD window, and a batch smaller than its shard waits for its slowest row before the next one
of that shard starts. benchmarks/query_window.py measured, against the capacity server (C=32
hidden, 1 replica, 1200 rows in shards of 300), throughput relative to the engine sending every
row in one call: batch 4 -> 0.59, batch 64 one batch at a time -> 0.80, batch 64 -> 0.94,
batch 300 = shard_rows -> 1.03. Hence engine openai's default batch_size is output.shard_rows
(fleetllm.sizing.rows_per_call), and these warnings.
"""

from __future__ import annotations

from typing import Any


def rows_in_flight_bound(batch_size: int, shard_rows: int, batches_in_flight: int) -> int:
    """Most requests one replica can have in flight, from the job's configuration alone."""
    return batches_in_flight * min(batch_size, shard_rows)


def window_warnings(spec: Any) -> list[str]:
    """Warnings for a JobSpec with engine openai whose batching keeps the AIMD window from filling."""
    from fleetllm.engines.openai.engine import parse_engine_kwargs
    from fleetllm.sizing import batches_in_flight, rows_per_call

    c, shard_rows = spec.compute, spec.output.shard_rows
    max_window = parse_engine_kwargs(spec.model.engine_kwargs).aimd.max_window
    batch = rows_per_call("openai", c, shard_rows)
    calls = batches_in_flight("openai", batch, c.batches_in_flight)
    bound = rows_in_flight_bound(batch, shard_rows, calls)
    warnings = []
    if batch < shard_rows:
        warnings.append(
            f"compute.batch_size ({batch}) is below output.shard_rows ({shard_rows}): a shard's batches "
            "run one after another, each waiting for its slowest row (retries included), so the endpoint idles "
            "between them; set compute.batch_size to output.shard_rows (the default for engine openai)")
    if bound < max_window:
        warnings.append(
            f"a replica holds at most {bound} requests in flight (compute.batches_in_flight {calls} x "
            f"min(batch_size {batch}, shard_rows {shard_rows})), below its AIMD ceiling "
            f"aimd.max_window ({max_window}): the window cannot grow past {bound}. Raise compute.batch_size or "
            "compute.batches_in_flight, or add replicas, if the endpoint can take more")
    return warnings
