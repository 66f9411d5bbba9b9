"""A replica's telemetry on the rows it hands back: one struct column, `_run`, stamped once per engine call
(every row of the call holds the same value):

    _run: {node, replica, ready, started, finished}

`node` the Ray node id ("" in-process), `replica` the replica's actor id ("" in-process), `ready` when its
engine was ready, `started` / `finished` when this engine call began and ended (epoch seconds). The driver
reads it for the run record (nodes, replicas, timeline), the ETA and the profile (fleetllm.batch.reports);
it is an internal column (stages.INTERNAL_COLUMNS), never written to the output. It travels on rows because
both executors (Ray Data's stream, the in-process local run) hand the driver tables and nothing else.
"""

from __future__ import annotations

from typing import Any

RUN = "_run"
FIELDS = ("node", "replica", "ready", "started", "finished")


def stamp(node: str, replica: str, ready: float, started: float, finished: float) -> dict[str, Any]:
    """The `_run` value of one engine call's rows."""
    return {"node": node, "replica": replica, "ready": ready, "started": started, "finished": finished}


def run_field(table, field: str) -> list[Any]:
    """`field` of each row's `_run` (a pyarrow table); [] where the table has no `_run` column."""
    import pyarrow.compute as pc

    if RUN not in table.column_names:
        return []
    return pc.struct_field(table.column(RUN), field).to_pylist()
