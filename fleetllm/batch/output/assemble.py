"""Assemble and commit: the driver groups the rows coming back from the replicas by shard and, once a
shard is complete, writes it through the output folder's atomic commit (fleetllm.batch.output.commit).
A row re-emitted by a retried task is kept once; fleetllm's internal columns are dropped here.
"""

from __future__ import annotations

from typing import Any

from fleetllm.batch.output.commit import ManifestEntry, OutputFolder, part_name
from fleetllm.batch.planning.columns import conform_table
from fleetllm.batch.planning.job_plan import JobPlan
from fleetllm.batch.planning.shards import Shard, shard_fingerprint
from fleetllm.batch.execution.stages import INTERNAL_COLUMNS, OUTPUT_TYPES
from fleetllm.batch.execution.telemetry import run_field


class ShardAssembler:
    """Collect rows by shard; hand back a shard's table once all its rows have arrived."""

    def __init__(self, shards: list[Shard]) -> None:
        self.expected = {s.shard_id: s.rows_to_compute for s in shards}
        self.parts: dict[int, list] = {}
        self.seen: dict[int, set] = {}

    def add(self, table) -> list[tuple[int, Any]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        done = []
        shard_col = table.column("_shard")
        for sid in pc.unique(shard_col).to_pylist():
            part = table.filter(pc.equal(shard_col, sid))
            lines = set(part.column("_line").to_pylist())
            seen = self.seen.setdefault(sid, set())
            if lines & seen:  # a retried task re-emitted rows: keep the first copy of each
                mask = [ln not in seen for ln in part.column("_line").to_pylist()]
                part = part.filter(pa.array(mask))
                lines -= seen
            seen |= lines
            self.parts.setdefault(sid, []).append(part)
            if len(seen) >= self.expected[sid]:
                tables = self.parts.pop(sid)
                self.seen.pop(sid)
                merged = pa.concat_tables(tables, promote_options="permissive").sort_by("_line")
                done.append((sid, merged))
        return done


def commit_shard(out: OutputFolder, plan: JobPlan, shard: Shard, table, writer) -> ManifestEntry:
    """Write a complete shard's data, then its commit object (a shard reopened by --retry-errors:
    fleetllm.batch.output.retry_errors.commit_retried)."""
    entry, data = shard_output(out, plan, shard, table)
    out.commit(entry, lambda fh: writer.write(fh, data))
    return entry


def shard_output(out: OutputFolder, plan: JobPlan, shard: Shard, table) -> tuple[ManifestEntry, Any]:
    """The commit entry and the data table (internal columns dropped, types fixed) of a shard's rows."""
    import pyarrow.compute as pc

    errors = table.num_rows - table.column("error").null_count
    node_ids = sorted(set(run_field(table, "node")) - {None})
    replicas = sorted(set(run_field(table, "replica")) - {None, ""})
    entry = ManifestEntry(
        shard=shard.shard_id, file=part_name(shard.shard_id, out.fmt), rows=table.num_rows, errors=errors,
        input_tokens=int(pc.sum(table.column("num_input_tokens")).as_py() or 0),
        output_tokens=int(pc.sum(table.column("num_generated_tokens")).as_py() or 0)
        if "num_generated_tokens" in table.column_names else 0,
        fingerprint=shard_fingerprint(plan.fingerprint, shard), nodes=[n for n in node_ids if n],
        cached_tokens=cached_tokens(table), replicas=replicas or None)
    drop = [c for c in INTERNAL_COLUMNS if c in table.column_names]
    if plan.spec.prompt.template and "messages" in table.column_names:
        drop.append("messages")
    if plan.task == "embed" and "num_generated_tokens" in table.column_names:
        drop.append("num_generated_tokens")  # an embedding generates nothing
    data = fixed_types(conform_table(table.drop_columns(drop), plan.columns))
    if plan.task == "embed":
        from fleetllm.batch.execution.embed_stage import fixed_size_embedding

        data = fixed_size_embedding(data, plan.embedding_dims)
    return entry, data


def cached_tokens(table) -> int | None:
    """Prompt tokens of the shard's rows found in the engine's prefix cache; None where no row's engine said."""
    import pyarrow.compute as pc

    if "_cached_tokens" not in table.column_names or table.column("_cached_tokens").null_count == table.num_rows:
        return None
    return int(pc.sum(table.column("_cached_tokens")).as_py() or 0)


def fixed_types(table):
    """Output columns get fixed types, so shards whose rows all lack a value (a null column) still
    share one schema with the others."""
    import pyarrow as pa

    for name, typ in OUTPUT_TYPES.items():
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, name, table.column(name).cast(pa.type_for_alias(typ)))
    return table
