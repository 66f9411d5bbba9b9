"""Around the pure plan (fleetllm.batch.planning.job_plan.plan_job), what acts:

    fetch_models(spec)   downloads into fleetllm's caches what the job is identified by (an embedded model
                         not yet pulled, LoRA adapters that are not local folders); never the output folder
    prepare(plan)        every write of planning, in the output folder, under its lock: the job record,
                         the column record, the input files' identities, the grouped shard files, other
                         plans' parts discarded; -> the plan with the shards as they will run

A run: fetch_models -> plan_job -> prepare -> execute -> report (fleetllm.batch.runner).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fleetllm.batch.planning import content_id
from fleetllm.batch.planning.columns import record as record_columns
from fleetllm.batch.output.commit import OutputFolder
from fleetllm.batch.planning.job_plan import JobPlan, grouping_readers, plan_job, prompt_parts
from fleetllm.batch.planning.shards import Shard, plan_shards
from fleetllm.spec import JobSpec


def fetch_models(spec: JobSpec) -> None:
    """Download what a run's plan identifies the job by, into fleetllm's caches (never the output folder): the
    embedded model when it is not pulled yet, the LoRA adapters that are not local folders. An endpoint's
    model is served: nothing to fetch."""
    from fleetllm import adapters, models
    from fleetllm.engines.capabilities import declared

    if declared(spec.model.engine).is_endpoint:
        return
    if spec.model.source in models.EMBEDDED and not models.is_cached(spec.model.source):
        models.resolve(spec.model.source, spec.model.revision, pull_missing=True)
    if spec.model.lora_adapters:
        adapters.resolve_all(spec.model.lora_adapters, fetch=True)


def plan_and_prepare(spec: JobSpec, *, overwrite: bool = False, preprocess: Callable | None = None,
                     resources: dict[str, float] | None = None) -> JobPlan:
    """fetch_models -> plan_job -> prepare: the plan a run executes (the caller holds the folder's lock)."""
    fetch_models(spec)
    return prepare(plan_job(spec, overwrite=overwrite, preprocess=preprocess, resources=resources))


def prepare(plan: JobPlan) -> JobPlan:
    """Every write of planning, in the output folder (the caller holds its lock: run_job): the job record
    (a folder of another job refused unless plan.overwrite), the input columns' types and the input files'
    identities this plan read, the grouped shard files (prefix grouping); other plans' parts discarded, so
    they are never read back mixed in. Returns the plan with its shards as they will run and what is
    committed of them."""
    spec = plan.spec
    out = OutputFolder(spec.output.path, spec.output.format)
    out.prepare(plan.fingerprint, plan.parts, plan.overwrite)
    if plan.column_record is not None:
        record_columns(spec.output.path, *plan.column_record)
    if plan.input_identities:
        content_id.record(spec.output.path, plan.input_identities)
    shards = plan.shards
    if plan.grouping is not None and plan.grouping.on:
        shards = grouped_shards(spec, shards, plan.grouping, prompt_parts(spec, plan.task))
    pending, committed = out.pending(shards, plan.fingerprint)
    out.discard_others(committed)
    return replace(plan, shards=shards, pending=pending, committed=committed)


def grouped_shards(spec: JobSpec, shards: list[Shard], grouping, parts: dict) -> list[Shard]:
    """The shards of the grouped input files (written once into the output folder; fleetllm.batch.planning.prefix)."""
    from fleetllm.batch.planning import prefix

    read, pre = grouping_readers(spec)
    gid = prefix.grouping_id(shards, spec.output.shard_rows, grouping, parts)
    files = prefix.group_input(shards, read, pre, grouping, spec.output.shard_rows, spec.output.path, gid)
    return plan_shards(files, spec.output.shard_rows)
