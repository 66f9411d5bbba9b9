"""Plan a batch job: the engine, the replicas, the shards and which are already committed, and the
checks that refuse a job before any model loads (columns, sampling, task). Loads no model.

    plan_job(spec)       -> JobPlan, pure: reads the input, the output folder's records and the caches;
                         writes and downloads nothing (`fleetllm run --dry-run` is plan_job + describe).
                         Before a run, fetch_models downloads; after, prepare writes
                         (fleetllm.batch.planning.job_prepare).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from fleetllm import sizing
from fleetllm.batch.planning import content_id
from fleetllm.batch.inputs import hf_input, input_files
from fleetllm.batch.planning.columns import describe as describe_columns, input_key as columns_key
from fleetllm.batch.planning.columns import recorded as recorded_columns
from fleetllm.batch.output.commit import ManifestEntry, OutputFolder
from fleetllm.batch.execution.engine_pool import EnginePool
from fleetllm.batch.planning.fingerprint import fingerprint, fingerprint_parts
from fleetllm.batch.planning.input_checks import check_ids, check_template_renders
from fleetllm.batch.planning.input_names import kept_name, renamed_hint
from fleetllm.batch.planning.shards import Shard, plan_shards
from fleetllm.batch.execution.stages import WRITTEN_COLUMNS
from fleetllm.batch.execution.tokenize_stage import tokenizes_ahead
from fleetllm.engines.capabilities import capabilities
from fleetllm.errors import InputError, PlanError
from fleetllm.sizing import ReplicaPlan, batches_in_flight
from fleetllm.spec import JobSpec, template_fields


@dataclass
class JobPlan:
    spec: JobSpec
    engine: str
    engine_reason: str
    model: Any  # models.ResolvedModel
    shards: list[Shard]
    pending: list[Shard]
    committed: dict[int, ManifestEntry]
    fingerprint: str
    parts: dict[str, Any]
    engine_kwargs: dict[str, Any]
    replica_plan: ReplicaPlan
    in_flight: int = 1
    sized_for: str = "the connected Ray cluster"
    rows_per_call: int = 16  # rows per engine call (a whole shard on vllm/openai by default)
    task: str = "generate"  # "embed": the replicas embed (spec.task, or the OpenAI Batch lines' url)
    embedding_dims: int | None = None  # vector size of an embed job's model, when its folder says it
    columns: Any = None  # pyarrow.Schema: the input columns' planned types (fleetllm.batch.planning.columns)
    grouping: Any = None  # fleetllm.batch.planning.prefix.Decision: rows grouped by prompt prefix, or not
    changed_files: list[str] = field(default_factory=list)  # input files whose content differs from the last run's
    kept_rows: int = 0  # --retry-errors: rows of reopened shards that stay as committed
    overwrite: bool = False  # the run replaces an output folder of another job (--overwrite)
    column_record: tuple | None = None  # (input key, pyarrow.Schema) typed by this plan: prepare records them
    input_identities: dict[str, Any] = field(default_factory=dict)  # input file -> identity: prepare records them

    @property
    def grouped(self) -> bool:
        return self.grouping is not None and self.grouping.on

    @property
    def lanes_by_prefix(self) -> bool:
        """Grouped on several replicas: each grouped file's shards run on one replica
        (fleetllm.batch.execution.stream)."""
        return self.grouped and self.replicas > 1

    @property
    def read_format(self) -> str:
        """The format the shards are read as: grouped shards are JSON lines (fleetllm.batch.planning.prefix)."""
        return input_files.GROUPED_FORMAT if self.grouped else self.spec.input.format

    @property
    def replicas(self) -> int:
        return self.replica_plan.replicas

    @property
    def resources(self) -> dict[str, float]:
        return {"CPU": self.replica_plan.cpus_per_replica, "GPU": self.replica_plan.gpus_per_replica}

    def request_sampling(self) -> dict[str, Any]:
        """The job's sampling as the engine stage takes it (rows without their own `sampling_params` run with
        it); {} for an embed job."""
        return self.spec.sampling.request_params(self.engine) if self.task == "generate" else {}

    @property
    def reads_images(self) -> bool:
        """Whether the model takes images: else image parts are refused as text-only, and none is fetched."""
        from fleetllm.engines.images import config_reads_images

        return not capabilities(self.engine).is_endpoint and config_reads_images(self.model.path)

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def skipped_rows(self) -> int:
        return sum(self.committed[s].rows for s in self.committed) + self.kept_rows

    @property
    def prompt_stage(self) -> str:
        """Where rows are templated and tokenized (fleetllm.batch.execution.tokenize_stage)."""
        if self.task == "generate" and tokenizes_ahead(self.engine, self.model.path, self.engine_kwargs):
            return "chat template + tokenization in preprocess tasks; replicas get token ids"
        if capabilities(self.engine).is_endpoint:
            return "messages sent as they are; the endpoint applies its chat template"
        return "chat template + tokenization in the replicas"

    def describe(self) -> list[str]:
        s = self.spec
        if self.task == "embed":
            dims = f"{self.embedding_dims} dimensions" if self.embedding_dims else "dimensions from the endpoint"
            task = [f"task       embed: one `embedding` vector per row ({dims})"]
        else:
            task = []
        return [
            f"job        {s.name}",
            *task,
            f"model      {s.model.source} -> {self.model.path} ({self.model.kind})",
            f"engine     {self.engine} ({self.engine_reason})",
            f"replicas   {self.replicas} x {self.resources}, {self.in_flight} batch(es) of {self.rows_per_call} "
            f"rows in flight per replica (sized for {self.sized_for})",
            *(f"           {line}" for line in self.replica_plan.description[1:]),
            "prompts    " + (self.prompt_stage if self.task == "generate"
                                 else "text as it is (no chat template), tokenized in the replicas"),
            f"input      {s.input.path}: {self.total_rows} rows in {len(self.shards)} shard(s) of "
            f"<= {s.output.shard_rows}",
            *([f"grouping   {self.grouping.reason}"] if self.grouping is not None else []),
            *(["           rows of one prefix bucket on one replica (one lane per replica)"]
              if self.lanes_by_prefix else []),
            f"resume     {len(self.committed)} shard(s) already committed, {len(self.pending)} to compute",
            *([f"changed    input file(s) whose content changed since the last run: {', '.join(self.changed_files)} "
               "(their changed shards are computed again)"] if self.changed_files else []),
            f"output     {s.output.path} ({s.output.format})",
            *([f"sampling   {s.sampling.as_params()}"] if self.task == "generate" else []),
            f"environment {s.environment.describe()}",
        ]


def check_columns(spec: JobSpec) -> list[dict[str, Any]]:
    """Fail at plan time when the rows lack what the prompt needs; name what is there. Returns the first
    rows it looked at."""
    if spec.input.format == "openai_batch":
        return []
    rows = (hf_input.peek(spec.input) if hf_input.is_hf(spec.input)
            else input_files.peek_rows(spec.input.path, spec.input.format))
    if spec.input.columns:
        rows = [hf_input.keep_columns(r, spec.input.columns) for r in rows]
    if not rows:
        return rows
    present = sorted({k for r in rows for k in r if not k.startswith("_")})
    if spec.task == "embed" and not spec.prompt.template and not {"text", "prompt"} & set(present):
        raise InputError(
            f"task embed needs the text to embed: the input rows have no `text` or `prompt` column and the job has "
            f"no prompt.template; columns present: {present}. Add prompt.template, e.g. "
            f"'{{{present[0] if present else 'text'}}}'")
    if spec.prompt.template:
        missing = [c for c in template_fields(spec.prompt.template) if c not in present]
        if missing:
            hints = "".join(renamed_hint(c) for c in missing if kept_name(c) in present)
            raise InputError(
                f"prompt.template {spec.prompt.template!r} uses column(s) {missing} that the input rows "
                f"lack; columns present: {present}{hints}")
    elif spec.task != "embed" and "messages" not in present and "prompt" not in present:
        raise InputError(
            f"the input rows have no `messages` or `prompt` column and the job has no prompt.template; "
            f"columns present: {present}. Add prompt.template, e.g. '{{{present[0] if present else 'text'}}}'")
    if spec.input.id_column and spec.input.id_column not in present:
        raise InputError(f"input.id_column {spec.input.id_column!r} is not a column; columns present: {present}"
                         f"{renamed_hint(spec.input.id_column) if kept_name(spec.input.id_column) in present else ''}")
    return rows


def plan_job(spec: JobSpec, *, overwrite: bool = False, preprocess: Callable | None = None,
             resources: dict[str, float] | None = None) -> JobPlan:
    """Plan a job against `resources` (the connected cluster's; default this machine's): the engine,
    the replicas, the shards and which of them are already committed. Pure: loads no model, writes and
    downloads nothing (an embedded model not pulled yet is planned as the folder it will be pulled to)."""

    sized_for = "the connected Ray cluster"
    if resources is None:
        resources = sizing.local_run_resources(spec.compute.cpus_per_replica, spec.compute.replicas)
        sized_for = "this machine; a run sizes for the cluster it connects to"
    replica_plan = sizing.plan_for_spec(spec.model, spec.compute, resources)
    engine, reason = replica_plan.engine, replica_plan.description[0]
    check_sampling_spec(spec, engine)
    model = _planned_model(spec, engine)
    if hf_input.is_hf(spec.input):
        shards = hf_input.plan(spec.input, spec.output.shard_rows)
    else:
        files = input_files.describe_files(spec.input.path, spec.input.format, spec.output.shard_rows)
        shards = plan_shards(files, spec.output.shard_rows, spec.input.limit)
    peeked = check_columns(spec)
    task, embedding_dims = job_task(spec, model, engine)
    columns, planned_now, key = None, False, None
    if not hf_input.is_hf(spec.input):  # a dataset's Arrow/parquet files are typed already
        columns, planned_now, key = _file_columns(spec, files)
    check_template_renders(spec, columns, peeked)
    engine_kwargs = _replica_engine_kwargs(spec, replica_plan, model)
    grouping = decide_grouping(spec, task, preprocess, shards, columns)
    prompt = prompt_parts(spec, task)
    parts = fingerprint_parts(
        model=model, engine=engine, engine_kwargs=engine_kwargs,
        sampling=spec.sampling.as_params() if task == "generate" else {},
        prompt={**prompt, **({"input_columns": spec.input.columns} if spec.input.columns else {})},
        chat_template_kwargs=spec.model.chat_template_kwargs, output_format=spec.output.format,
        preprocess=preprocess)
    if grouping.on:  # only then: fingerprints of ungrouped jobs stay as they were
        parts["prefix_grouping"] = grouping.fingerprint_part()
    if columns is not None:
        parts["input_columns"] = describe_columns(columns)  # other types would make the folder unreadable
    fp = fingerprint(parts)
    out = OutputFolder(spec.output.path, spec.output.format)
    identities = {} if hf_input.is_hf(spec.input) else {f.rel: f.identity for f in files}
    changed = content_id.changed_files(content_id.recorded(spec.output.path), identities)
    existing = out.read_job()  # what a run would resume (prepare reads it again under the lock)
    same = existing is not None and existing.get("fingerprint") == fp
    pending, committed = (out.pending(shards, fp) if same and not overwrite else (shards, {}))
    rows_per_call = sizing.rows_per_call(engine, spec.compute, spec.output.shard_rows)
    in_flight = batches_in_flight(engine, rows_per_call, spec.compute.batches_in_flight)
    return JobPlan(spec, engine, reason, model, shards, pending, committed, fp, parts, engine_kwargs,
                   replica_plan, in_flight, sized_for, rows_per_call, task, embedding_dims, columns, grouping,
                   changed, overwrite=overwrite, column_record=(key, columns) if planned_now else None,
                   input_identities=identities)


def _planned_model(spec: JobSpec, engine: str):
    """The model the plan identifies the job by (models.ResolvedModel), looked up, never pulled: an endpoint's
    served id; a hub id pinned to its commit (fleetllm.hub_revision); an embedded model not pulled yet, the
    folder it will be pulled to (fetch_models pulls it before a run plans)."""
    from fleetllm import models

    if capabilities(engine).is_endpoint:  # a model behind an endpoint: nothing to look up or pull
        return models.served(spec.model.source)
    if spec.model.source in models.EMBEDDED and not models.is_cached(spec.model.source):
        return models.ResolvedModel(spec.model.source, "embedded",
                                    str(models.cache_dir(spec.model.source)) + " (pulled on first run)")
    model = models.resolve(spec.model.source, spec.model.revision, pull_missing=False)
    if model.kind == "hub":  # the commit, not a branch that moves (fleetllm.hub_revision)
        from fleetllm.hub_revision import pin_revision

        model = pin_revision(model, spec.model.revision or spec.model.engine_kwargs.get("revision"))
    return model


def _file_columns(spec: JobSpec, files) -> tuple[Any, bool, str]:
    """The input files' column types (recorded by an earlier run over the same files, else planned now), whether
    they were planned now, and the key they are recorded under; the ids checked."""
    key = columns_key(files, spec.input.format, WRITTEN_COLUMNS)
    columns = recorded_columns(spec.output.path, key)  # planned by an earlier run over the same files
    planned_now = columns is None
    if planned_now:
        columns = input_files.plan_columns(files, spec.input.format, skip=WRITTEN_COLUMNS)
    check_ids(spec, files)
    return columns, planned_now, key


def _replica_engine_kwargs(spec: JobSpec, replica_plan, model) -> dict[str, Any]:
    """The engine's keyword arguments for each replica: sizing's, the pinned hub revision, the LoRA adapters
    resolved to local folders."""
    engine_kwargs = sizing.engine_kwargs_for(replica_plan, spec.model.engine_kwargs)
    if model.kind == "hub" and model.revision:
        engine_kwargs["revision"] = model.revision  # the replicas load the pinned commit
    if spec.model.lora_adapters:  # resolved to local folders; the engine loads them (and they fingerprint the job)
        from fleetllm import adapters

        # nothing fetched here (fetch_models did, before a run): local folders and fetched copies, as the run has them
        engine_kwargs["lora_adapters"] = adapters.resolve_all(spec.model.lora_adapters, fetch=False)
    return engine_kwargs


def prompt_parts(spec: JobSpec, task: str) -> dict[str, Any]:
    """The prompt's part of the fingerprint (and of the prefix groups)."""
    parts = {"system": spec.prompt.system, "template": spec.prompt.template,
             "input_format": spec.input.format, "id_column": spec.input.id_column}
    if task == "embed":  # only then: fingerprints of generate jobs stay as they were
        parts["task"] = "embed"
    for name, value in (("image_column", spec.prompt.image_column), ("adapter_column", spec.model.adapter_column)):
        if value:  # only when set: fingerprints of other jobs stay as they were
            parts[name] = value
    return parts


def decide_grouping(spec: JobSpec, task: str, preprocess: Callable | None, shards: list[Shard], columns: Any = None):
    """compute.prefix_grouping for this job (fleetllm.batch.planning.prefix.decide), from a sample of its prompts."""
    from fleetllm.batch.planning import prefix

    mode = spec.compute.prefix_grouping
    embeddings = " (OpenAI Batch /v1/embeddings lines)" if spec.input.format == "openai_batch" else ""
    why_not = (f"embed jobs{embeddings}" if task == "embed" else "a custom preprocess" if preprocess is not None
               else None)
    if why_not is not None:
        if mode == "on":
            raise PlanError(f"compute.prefix_grouping: on does not apply to {why_not} (the key is a generate job's "
                            "own prompt); set it to auto or off")
        return prefix.Decision(False, mode, 0, f"{mode}: not for {why_not}")
    total = sum(s.rows for s in shards)
    if mode == "off" or (mode == "auto" and total < prefix.AUTO_MIN_ROWS):  # decided without reading a row
        return prefix.decide(mode, [], total)
    read, pre = grouping_readers(spec)
    rows = [row for s in prefix.sample_shards(shards) for row in read(s)]
    kept = prefix.json_unsafe_column(columns, rows)  # the grouped files are JSON lines
    if kept is not None:
        if mode == "on":
            raise PlanError(f"compute.prefix_grouping: on cannot keep input column {kept[0]!r} ({kept[1]}): grouped "
                            "rows travel as JSON lines; cast the column to text first, or set prefix_grouping: off")
        return prefix.Decision(False, mode, 0, f"auto: off, column {kept[0]!r} ({kept[1]}) would not survive "
                                                "the grouped JSON files")
    return prefix.decide(mode, [prefix.prompt_text(pre(row)) for row in rows], total)


def grouping_readers(spec: JobSpec) -> tuple[Callable, Callable]:
    """(read a shard's rows, build a row's prompt) as the job does, for the grouping's key: the job's
    template, or an OpenAI Batch line's messages or prompt (fleetllm.batch.inputs.openai_batch)."""
    from fleetllm.batch.execution.stages import TemplatePreprocessor
    from fleetllm.batch.inputs.shard_rows import read_shard_rows

    def read(shard: Shard) -> list[dict]:
        return read_shard_rows(shard.to_dict(), spec.input.format, None, spec.input.columns)

    if spec.input.format == "openai_batch":
        from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor

        return read, OpenAIBatchPreprocessor({})  # generate lines: embed jobs are never grouped
    return read, TemplatePreprocessor(spec.prompt.system, spec.prompt.template, spec.input.id_column)


def job_task(spec: JobSpec, model: Any, engine: str) -> tuple[str, int | None]:
    """(task, vector size) of a job: spec.task, or for OpenAI Batch input the lines' url; PlanError when the
    spec and the lines disagree, or when a generate job names an embedding model."""
    from fleetllm import models

    task = spec.task
    if spec.input.format == "openai_batch":
        from fleetllm.batch.inputs.openai_batch import file_task

        task = file_task(spec.input.path)
        if "task" in spec.model_fields_set and spec.task != task:
            raise PlanError(f"task is {spec.task} but the OpenAI Batch lines' url says {task} "
                            "(/v1/embeddings lines embed); remove `task` from the spec, the lines decide")
    if capabilities(engine).is_endpoint:
        return task, None
    if task == "generate" and models.model_task(model) == "embed":
        raise PlanError(f"model {spec.model.source!r} is an embedding model: it cannot generate text. Set "
                        "`task: embed` at the top of the spec for an `embedding` column, or choose a generative model")
    if task == "embed":
        from fleetllm.engines.embedding import read_model_info

        return task, read_model_info(model.path).dimensions
    return task, None


def check_sampling_spec(spec: JobSpec, engine: str) -> None:
    """The job's `sampling` against the field table (fleetllm.engines.fields) for its engine, at plan time."""
    from fleetllm.engines.fields import FieldError, check_sampling

    try:
        check_sampling(spec.sampling.as_params(), engine)
    except FieldError as exc:
        raise PlanError(f"sampling: {exc}") from None


def engine_pool(plan: JobPlan) -> EnginePool:
    """The replicas that run the plan's pending shards (fleetllm.batch.execution.engine_pool)."""
    spec = plan.spec
    pending_rows = sum(s.rows_to_compute for s in plan.pending)
    rows_in_flight = min(plan.in_flight * plan.rows_per_call, -(-pending_rows // max(1, plan.replicas)))
    return EnginePool(engine=plan.engine, model_path=plan.model.path, engine_kwargs=plan.engine_kwargs,
                      replica_plan=plan.replica_plan, batch_size=plan.rows_per_call,
                      in_flight=plan.in_flight, chat_template_kwargs=spec.model.chat_template_kwargs,
                      max_retries=spec.compute.max_retries, task=plan.task,
                      rows_in_flight=max(1, rows_in_flight), sampling=plan.request_sampling(),
                      images=spec.prompt.images.limits(local_files=True).as_dict() if plan.reads_images else None)
