"""A batch as a fleetllm job: its job spec (openai_batch in, openai_batch out, engine openai against this
server's own URL, so every row goes through the served replicas' engines; lines grouped by prompt prefix)
and the partial finalize of a cancelled or expired batch (output.jsonl / errors.jsonl from the shards
committed so far)."""

from __future__ import annotations

import json
from typing import Any

from fleetllm.batches.store import BATCH_HEADER, BatchStore
from fleetllm.spec import JobSpec

API_KEY_ENV = "FLEETLLM_BATCH_API_KEY"  # the child job reads the server's key from here (never from a file)


def job_spec(store: BatchStore, batch: dict[str, Any], base_url: str, model: str, shard_rows: int,
             max_in_flight: int) -> JobSpec:
    """The job of one batch; deterministic, so a restarted server rebuilds the same job and resumes it."""
    input_file = store.get_file(batch["input_file_id"])
    aimd = {"initial_window": min(8, max_in_flight), "max_window": max_in_flight}
    return JobSpec.model_validate({
        "name": batch["id"],
        "task": "embed" if batch["endpoint"] == "/v1/embeddings" else "generate",
        "model": {"source": model, "engine": "openai",
                  "engine_kwargs": {"base_url": base_url, "api_key_env": API_KEY_ENV, "max_retries": 8,
                                    "headers": {BATCH_HEADER: batch["id"]}, "aimd": aimd}},
        "input": {"path": store.url_of(input_file["path"]), "format": "openai_batch"},
        "output": {"path": store.job_url(batch["id"]), "format": "openai_batch", "shard_rows": shard_rows},
        # lines sharing a prompt prefix run together, so the replicas' prefix cache computes it once
        # (fleetllm.batch.planning.prefix; auto: only where a sample of the lines shows shared prefixes)
        "compute": {"batches_in_flight": max(1, -(-max_in_flight // shard_rows)), "prefix_grouping": "auto"},
    })


def committed_counts(store: BatchStore, batch_id: str) -> tuple[int, int]:
    """(completed, failed) rows over the shards committed so far."""
    from fleetllm.batch.output.commit import OutputFolder

    entries = OutputFolder(store.job_url(batch_id), "openai_batch").read_commits().values()
    return sum(e.rows - e.errors for e in entries), sum(e.errors for e in entries)


def usage(store: BatchStore, batch_id: str) -> dict[str, Any]:
    """The Batch object's `usage`: tokens over the committed shards."""
    from fleetllm.batch.output.commit import OutputFolder

    entries = OutputFolder(store.job_url(batch_id), "openai_batch").read_commits().values()
    prompt, output = sum(e.input_tokens for e in entries), sum(e.output_tokens for e in entries)
    cached = sum(e.cached_tokens or 0 for e in entries)
    return {"input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output,
            "input_tokens_details": {"cached_tokens": cached}, "output_tokens_details": {"reasoning_tokens": 0}}


def finalize_partial(spec: JobSpec) -> None:
    """Write output.jsonl and errors.jsonl from the committed shards (the job was stopped before its end)."""
    from fleetllm.batch.execution import local_run
    from fleetllm.batch.output.commit import OutputFolder
    from fleetllm.batch.planning.job_prepare import plan_and_prepare
    from fleetllm.batch.inputs.openai_batch import OpenAIBatchWriter

    plan = plan_and_prepare(spec, resources=local_run.local_resources_for_run(spec))
    OpenAIBatchWriter().finalize(OutputFolder(spec.output.path, "openai_batch"), plan)


def count_lines(store: BatchStore, rel: str) -> int:
    try:
        with store.fs.open(store.p(rel), "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except FileNotFoundError:
        return 0


def spec_yaml(spec: JobSpec) -> str:
    return json.dumps(spec.model_dump(mode="json", exclude_defaults=True))  # JSON is YAML
