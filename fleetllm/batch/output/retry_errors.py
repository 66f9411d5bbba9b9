"""`fleetllm run|query --retry-errors`: recompute only the rows of an existing output whose `error` is set.

After the plan (the same job: same fingerprint, the folder's lock held), every committed shard whose
commit counts errors is read back; the lines of its failed rows become the shard's `only_lines`, and
the shard goes back to `pending`: its failed rows alone are read, sent and computed. When the shard's
rows have all come back, `commit_retried` writes the shard again whole, its kept rows and its
recomputed rows in their place (in line order), under the same name through the same atomic commit
(data, then commit object), so every row still appears exactly once, whatever moment a kill comes.
Shards not committed yet are computed as in any resume.

Modes: "all" (every row whose `error` is set) and "retryable" (only the errors another attempt may
mend: retries spent on 429/5xx/timeouts, an answer past the size cap, an engine call that failed as a
whole; not an endpoint's 4xx answer about the row, nor an error of the row's input or template).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from fleetllm.batch.output.assemble import shard_output
from fleetllm.batch.output.commit import ManifestEntry, OutputFolder
from fleetllm.batch.planning.shards import Shard
from fleetllm.errors import PlanError

MODES = ("all", "retryable")
RETRYABLE = re.compile(r"\(after \d+ attempts\)$|^engine error after |max_response_mb")


def wanted(error: str | None, mode: str) -> bool:
    """True when a row with this `error` is recomputed in this mode."""
    return error is not None and (mode == "all" or RETRYABLE.search(error) is not None)


def read_part(out: OutputFolder, entry: ManifestEntry):
    """A committed shard's data as an Arrow table (parquet or jsonl)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with out.fs.open(out.p(entry.file), "rb") as fh:
        if out.fmt == "parquet":
            return pq.read_table(fh)
        return pa.Table.from_pylist([json.loads(line) for line in fh if line.strip()])


def reopen_errors(plan: Any, out: OutputFolder, mode: str) -> int:
    """Move the committed shards holding failed rows (of `mode`) back to plan.pending, each with the
    lines to recompute; returns how many rows will be recomputed. Changes the plan, not the folder."""
    if mode not in MODES:
        raise PlanError(f"--retry-errors {mode!r}: use one of {', '.join(MODES)}")
    if plan.spec.output.format == "openai_batch":
        raise PlanError("--retry-errors rewrites a shard's rows; output.format openai_batch is not supported: "
                        "run the failed lines (errors.jsonl) as a new batch instead")
    by_id = {s.shard_id: s for s in plan.shards}
    entries = out.committed(plan.shards, plan.fingerprint)
    reopened, rows = [], 0
    for sid, entry in sorted(entries.items()):
        if not entry.errors:
            continue
        shard = by_id[sid]
        errors = read_part(out, entry).column("error").to_pylist()
        if len(errors) != shard.rows:
            raise PlanError(f"{out.p(entry.file)} holds {len(errors)} rows where its shard has {shard.rows}; it "
                            "was not written by this job's plan: rerun with --overwrite")
        lines = tuple(shard.start + k for k, e in enumerate(errors) if wanted(e, mode))
        if lines:
            reopened.append(dataclasses.replace(shard, only_lines=lines))
            rows += len(lines)
    for shard in reopened:
        plan.committed.pop(shard.shard_id, None)
        plan.kept_rows += shard.rows - len(shard.only_lines)
    plan.pending = sorted([*plan.pending, *reopened], key=lambda s: s.shard_id)
    return rows


def commit_retried(out: OutputFolder, plan: Any, shard: Shard, table, writer) -> ManifestEntry:
    """Commit a reopened shard: its kept rows and the recomputed `table` merged in line order, written
    whole over the old part (atomically), then its commit object. Returns the recomputed rows' entry
    (for the run's totals); the commit object counts the whole shard."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = table.column("_line").to_pylist()
    fresh, data = shard_output(out, plan, shard, table)
    old = read_part(out, fresh)
    if old.num_rows != shard.rows:
        raise PlanError(f"{out.p(fresh.file)} holds {old.num_rows} rows where its shard has {shard.rows}; it was "
                        "not written by this job's plan: rerun with --overwrite")
    retried = set(shard.only_lines or ())
    positions = [shard.start + k for k in range(old.num_rows)]
    keep = [p not in retried for p in positions]
    kept = old.filter(pa.array(keep)).append_column("__pos", pa.array([p for p, k in zip(positions, keep) if k],
                                                                     pa.int64()))
    new = data.append_column("__pos", pa.array(lines, pa.int64()))
    merged = pa.concat_tables([kept, new.select(kept.column_names) if set(kept.column_names) == set(new.column_names)
                               else new], promote_options="permissive").sort_by("__pos").drop_columns(["__pos"])

    def total(name: str) -> int:
        return int(pc.sum(merged.column(name)).as_py() or 0) if name in merged.column_names else 0

    whole = dataclasses.replace(
        fresh, rows=merged.num_rows, errors=merged.num_rows - merged.column("error").null_count,
        input_tokens=total("num_input_tokens"), output_tokens=total("num_generated_tokens"), cached_tokens=None)
    out.commit(whole, lambda fh: writer.write(fh, merged))
    return fresh
