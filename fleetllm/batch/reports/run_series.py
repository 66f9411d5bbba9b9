"""The series a run keeps in its run record (_SUCCESS) for `fleetllm report`: one point per committed shard (time,
rows, tokens, errors), rows per engine replica, and the time split (start-up, generation, commit).

Pure bookkeeping fed by the runner's loop; replicas are told apart by (node, ready time), from the
telemetry the engine stage stamps on its rows (`_run`: fleetllm.batch.execution.telemetry).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from fleetllm.batch.execution.telemetry import run_field


class RunSeries:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.points: list[list[float]] = []  # [seconds since start, rows, output tokens, errors, input tokens]
        self.replica_rows: Counter = Counter()
        self.commit_s = 0.0

    def batch(self, batch) -> None:
        """A batch of rows back from the replicas (a pyarrow table)."""
        for node, ready in zip(run_field(batch, "node"), run_field(batch, "ready")):
            self.replica_rows[(node or "", ready)] += 1

    def commit(self, entry, started: float) -> None:
        """A shard committed (a ManifestEntry); `started` is when its commit began."""
        now = time.time()
        self.commit_s += now - started
        self.points.append([round(now - self.t0, 3), entry.rows, entry.output_tokens, entry.errors,
                            entry.input_tokens])

    def as_dict(self, ready_at: float | None, generation_wall: float, wall: float) -> dict[str, Any]:
        replicas = sorted(self.replica_rows.items(), key=lambda kv: kv[0][1] or 0)
        start_up = (ready_at - self.t0) if ready_at else (self.points[0][0] if self.points else wall)
        return {
            "commits": {"columns": ["t_s", "rows", "output_tokens", "errors", "input_tokens"],
                        "points": self.points},
            "replicas": [{"replica": k, "node": node, "ready_s": round(ready - self.t0, 3) if ready else None,
                          "rows": n} for k, ((node, ready), n) in enumerate(replicas)],
            "time_split_s": {"start_up": round(max(start_up, 0.0), 3),
                             "generation": round(max(generation_wall - self.commit_s, 0.0), 3),
                             "commit": round(self.commit_s, 3),
                             "other": round(max(wall - max(start_up, 0.0) - generation_wall, 0.0), 3)},
        }
