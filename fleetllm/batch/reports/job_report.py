"""The run record (_SUCCESS): what a batch job did (rows, errors, tokens, throughput, replicas, versions), from the
output folder's committed shards and the run's totals."""

from __future__ import annotations

import json
import platform
from typing import Any

from fleetllm import __version__
from fleetllm.batch.output.commit import OutputFolder
from fleetllm.batch.planning.fingerprint import engine_version
from fleetllm.batch.planning.job_plan import JobPlan


def make_report(plan: JobPlan, totals: dict[str, int], wall: float, generation_wall: float,
                out: OutputFolder) -> dict[str, Any]:
    from importlib.metadata import version

    committed = out.committed(plan.shards, plan.fingerprint)
    rows_total = sum(e.rows for e in committed.values())
    errors_total = sum(e.errors for e in committed.values())
    nodes = sorted({n for e in committed.values() for n in e.nodes})
    return {**prefix_cache(plan, committed.values()),
        "name": plan.spec.name,
        "complete": len(committed) == len(plan.shards),
        "rows": rows_total,
        "rows_computed": totals["rows"],
        "rows_skipped": plan.skipped_rows,
        "shards": len(plan.shards),
        "shards_computed": len(plan.pending),
        "shards_skipped": len(plan.committed),
        "errors": errors_total,
        "error_rate": errors_total / rows_total if rows_total else 0.0,
        "input_tokens": sum(e.input_tokens for e in committed.values()),
        "output_tokens": sum(e.output_tokens for e in committed.values()),
        "output_tokens_computed": totals["output_tokens"],
        "wall_time_s": round(wall, 3),
        "rows_per_s": round(totals["rows"] / wall, 3) if wall else None,
        "output_tokens_per_s": round(totals["output_tokens"] / wall, 3) if wall else None,
        "generation_wall_s": round(generation_wall, 3),
        "output_tokens_per_s_after_engine_start":
            round(totals["output_tokens"] / generation_wall, 3) if generation_wall > 0 else None,
        "model": {"source": plan.spec.model.source, "path": plan.model.path, "kind": plan.model.kind},
        "engine": {"name": plan.engine, "version": engine_version(plan.engine), "why": plan.engine_reason},
        "replicas": plan.replicas,
        "batches_in_flight_per_replica": plan.in_flight,
        "rows_per_engine_call": plan.rows_per_call,
        "resources_per_replica": plan.resources,
        "nodes": nodes,
        "shard_nodes": {str(e.shard): e.nodes for e in committed.values()},
        "shard_replicas": {str(e.shard): e.replicas for e in committed.values() if e.replicas},
        "fingerprint": plan.fingerprint,
        "versions": {"fleetllm": __version__, "ray": version("ray"), "python": platform.python_version()},
        "spec": json.loads(plan.spec.model_dump_json()),
    }


def prefix_cache(plan: JobPlan, entries) -> dict[str, Any]:
    """prompt_tokens, cached_prompt_tokens (None where the engine does not say: transformers, openai) and
    prefix_cache_hit_rate (cached / prompt tokens of the shards whose engine said), and the grouping."""
    entries = list(entries)
    said = [e for e in entries if e.cached_tokens is not None]
    cached = sum(e.cached_tokens for e in said) if said else None
    prompt_said = sum(e.input_tokens for e in said)
    grouping = plan.grouping
    return {
        "prompt_tokens": sum(e.input_tokens for e in entries),
        "cached_prompt_tokens": cached,
        "prefix_cache_hit_rate": round(cached / prompt_said, 4) if said and prompt_said else None,
        "prefix_grouping": None if grouping is None else {
            "mode": grouping.mode, "on": grouping.on, "key_chars": grouping.key_chars, "why": grouping.reason,
            "replica_affinity": plan.lanes_by_prefix},
    }
