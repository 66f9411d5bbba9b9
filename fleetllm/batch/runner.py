"""`fleetllm run`: plan, stream the shards through engine replicas on Ray Data, commit, report.

A local job of one replica runs the same plan, stage, commits and report in this process without Ray
(fleetllm.batch.local_run: its engine starts while the first shards are read and tokenized).

    plan (files -> shards) -> skip committed shards -> Ray Data:
        from_items(shards) -> flat_map(read shard) -> map(preprocess)
        -> [vllm: map_batches(add_prompt_token_ids)] -> map_batches(EngineStage, replicas)
    -> the driver iterates the stream, groups rows by shard, commits each complete shard atomically.

The driver never holds more than the shards in flight; the manifest makes the job resumable.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.console import Console

from fleetllm import __version__
from fleetllm import sizing
from fleetllm.batch import hf_input, io as bio
from fleetllm.batch.columns import conform_row, conform_table, describe as describe_columns, input_key as columns_key
from fleetllm.batch.columns import record as record_columns, recorded as recorded_columns
from fleetllm.batch.commit import ManifestEntry, OutputFolder, part_name
from fleetllm.batch.fingerprint import engine_version, fingerprint, fingerprint_parts
from fleetllm.batch.engine_pool import EnginePool, batches_in_flight, engine_is_concurrent
from fleetllm.batch.plan import Shard, plan_shards, shard_fingerprint
from fleetllm.batch.progress import JobProgress
from fleetllm.batch.stages import INTERNAL_COLUMNS, TemplatePreprocessor
from fleetllm.batch.writers import shard_writer
from fleetllm.errors import EndpointError, InputError, PlanError
from fleetllm.report.series import RunSeries
from fleetllm.sizing import ReplicaPlan
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
    columns: Any = None  # pyarrow.Schema: the input columns' planned types (fleetllm.batch.columns)

    @property
    def replicas(self) -> int:
        return self.replica_plan.replicas

    @property
    def resources(self) -> dict[str, float]:
        return {"CPU": self.replica_plan.cpus_per_replica, "GPU": self.replica_plan.gpus_per_replica}

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def skipped_rows(self) -> int:
        return sum(self.committed[s].rows for s in self.committed)

    @property
    def prompt_stage(self) -> str:
        """Where rows are templated and tokenized (fleetllm.batch.tokenize_stage)."""
        if engine_pool(self).tokenize_stage_kwargs() is not None:
            return "chat template + tokenization in preprocess tasks; replicas get token ids"
        if self.engine == "openai":
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
            f"prompts    {self.prompt_stage if self.task == 'generate' else 'text as it is (no chat template), tokenized in the replicas'}",
            f"input      {s.input.path}: {self.total_rows} rows in {len(self.shards)} shard(s) of <= {s.output.shard_rows}",
            f"resume     {len(self.committed)} shard(s) already committed, {len(self.pending)} to compute",
            f"output     {s.output.path} ({s.output.format})",
            *([f"sampling   {s.sampling.as_params()}"] if self.task == "generate" else []),
            f"environment {s.environment.describe()}",
        ]


def check_columns(spec: JobSpec) -> None:
    """Fail at plan time when the rows lack what the prompt needs; name what is there."""
    if spec.input.format == "openai_batch":
        return
    rows = hf_input.peek(spec.input) if hf_input.is_hf(spec.input) else bio.peek_rows(spec.input.path, spec.input.format)
    if spec.input.columns:
        rows = [hf_input.keep_columns(r, spec.input.columns) for r in rows]
    if not rows:
        return
    present = sorted({k for r in rows for k in r if not k.startswith("_")})
    if spec.task == "embed" and not spec.prompt.template and not {"text", "prompt"} & set(present):
        raise InputError(
            f"task embed needs the text to embed: the input rows have no `text` or `prompt` column and the job has "
            f"no prompt.template; columns present: {present}. Add prompt.template, e.g. "
            f"'{{{present[0] if present else 'text'}}}'")
    if spec.prompt.template:
        missing = [c for c in template_fields(spec.prompt.template) if c not in present]
        if missing:
            raise InputError(
                f"prompt.template {spec.prompt.template!r} uses column(s) {missing} that the input rows "
                f"lack; columns present: {present}")
    elif spec.task != "embed" and "messages" not in present and "prompt" not in present:
        raise InputError(
            f"the input rows have no `messages` or `prompt` column and the job has no prompt.template; "
            f"columns present: {present}. Add prompt.template, e.g. '{{{present[0] if present else 'text'}}}'")
    if spec.input.id_column and spec.input.id_column not in present:
        raise InputError(f"input.id_column {spec.input.id_column!r} is not a column; columns present: {present}")


def local_resources() -> dict[str, float]:
    """This machine's CPUs and GPUs: what a dry run sizes for when no cluster is connected."""
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(sizing.local_gpu_count())}


def plan_job(spec: JobSpec, *, overwrite: bool = False, dry_run: bool = False,
             preprocess: Callable | None = None, resources: dict[str, float] | None = None) -> JobPlan:
    """Plan a job against `resources` (the connected cluster's; default this machine's): the engine,
    the replicas, the shards and which of them are already committed. Loads no model."""
    from fleetllm import models

    sized_for = "the connected Ray cluster"
    if resources is None:
        resources, sized_for = local_resources(), "this machine; a run sizes for the cluster it connects to"
    replica_plan = sizing.plan_for_spec(spec.model, spec.compute, resources)
    engine, reason = replica_plan.engine, replica_plan.description[0]
    check_sampling_spec(spec, engine)
    if engine == "openai":  # a model behind an endpoint: nothing to look up or pull
        model = models.served(spec.model.source)
    elif not (dry_run and spec.model.source in models.EMBEDDED and not models.is_cached(spec.model.source)):
        model = models.resolve(spec.model.source, spec.model.revision, pull_missing=not dry_run)
    else:
        model = models.ResolvedModel(spec.model.source, "embedded",
                                     str(models.cache_dir(spec.model.source)) + " (pulled on first run)")
    if hf_input.is_hf(spec.input):
        shards = hf_input.plan(spec.input, spec.output.shard_rows)
    else:
        files = bio.describe_files(spec.input.path, spec.input.format, spec.output.shard_rows)
        shards = plan_shards(files, spec.output.shard_rows, spec.input.limit)
    check_columns(spec)
    task, embedding_dims = job_task(spec, model, engine)
    columns, planned_now, key = None, False, None
    if not hf_input.is_hf(spec.input):  # a dataset's Arrow/parquet files are typed already
        key = columns_key(files, spec.input.format, WRITTEN_COLUMNS)
        columns = recorded_columns(spec.output.path, key)  # planned by an earlier run over the same files
        planned_now = columns is None
        if planned_now:
            columns = bio.plan_columns(files, spec.input.format, skip=WRITTEN_COLUMNS)
    engine_kwargs = sizing.engine_kwargs_for(replica_plan, spec.model.engine_kwargs)
    prompt_parts = {"system": spec.prompt.system, "template": spec.prompt.template,
                    "input_format": spec.input.format, "id_column": spec.input.id_column}
    if task == "embed":  # only then: fingerprints of generate jobs stay as they were
        prompt_parts["task"] = "embed"
    parts = fingerprint_parts(
        model=model, engine=engine, engine_kwargs=engine_kwargs,
        sampling=spec.sampling.as_params() if task == "generate" else {},
        prompt={**prompt_parts, **({"input_columns": spec.input.columns} if spec.input.columns else {})},
        chat_template_kwargs=spec.model.chat_template_kwargs, output_format=spec.output.format,
        preprocess=preprocess)
    if columns is not None:
        parts["input_columns"] = describe_columns(columns)  # other types would make the folder unreadable
    fp = fingerprint(parts)
    out = OutputFolder(spec.output.path, spec.output.format)
    if dry_run:
        existing = out.read_job()
        same = existing is not None and existing.get("fingerprint") == fp
        pending, committed = (out.pending(shards, fp) if same and not overwrite else (shards, {}))
    else:  # the caller holds the folder's lock (run_job)
        out.prepare(fp, parts, overwrite)
        if planned_now:
            record_columns(spec.output.path, key, columns)
        pending, committed = out.pending(shards, fp)
        out.discard_others(committed)  # other plans' shards are never read back mixed in
    rows_per_call = rows_per_engine_call(spec, engine)
    in_flight = batches_in_flight(engine, rows_per_call, spec.compute.batches_in_flight)
    return JobPlan(spec, engine, reason, model, shards, pending, committed, fp, parts, engine_kwargs,
                   replica_plan, in_flight, sized_for, rows_per_call, task, embedding_dims, columns)


def job_task(spec: JobSpec, model: Any, engine: str) -> tuple[str, int | None]:
    """(task, vector size) of a job: spec.task, or for OpenAI Batch input the lines' url; PlanError when the
    spec and the lines disagree, or when a generate job names an embedding model."""
    from fleetllm import models
    from fleetllm.errors import PlanError

    task = spec.task
    if spec.input.format == "openai_batch":
        from fleetllm.batch.openai_batch import file_task

        task = file_task(spec.input.path)
        if "task" in spec.model_fields_set and spec.task != task:
            raise PlanError(f"task is {spec.task} but the OpenAI Batch lines' url says {task} "
                            "(/v1/embeddings lines embed); remove `task` from the spec, the lines decide")
    if engine == "openai":
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


def rows_per_engine_call(spec: JobSpec, engine: str) -> int:
    """compute.batch_size; on engines that batch continuously, when batch_size is left at its default,
    output.shard_rows: a shard is one block, handed over in one call, and the engine schedules its rows."""
    if engine_is_concurrent(engine) and "batch_size" not in spec.compute.model_fields_set:
        return spec.output.shard_rows
    return spec.compute.batch_size


def init_ray(address: str | None, min_cpus: float = 1, runtime_env: dict[str, Any] | None = None) -> None:
    """Connect to `address` (or $RAY_ADDRESS); else start a private local Ray. `runtime_env` (the job's
    `environment:`) becomes the job's Ray runtime_env: every replica and task runs in it."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR",
                 runtime_env=runtime_env)
    if address:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR", runtime_env=runtime_env)
    else:
        from fleetllm.batch.local_run import local_cpus

        cpus = local_cpus(min_cpus)  # +1: room for the read/prepare tasks
        # Ray starts its workers at nice 15; the engine replicas are the work here, and at nice 15 every
        # wake-up of Ray's own processes stalls their torch threads (0.55 -> 0.89 of the bare engine on
        # 2 cores, benchmarks/pipeline_overhead.py). Ray's job supervisor sets 0 for the same reason.
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(address="local", num_cpus=cpus, **quiet)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.verbose_progress = False


def _read_shard_rows(item: dict[str, Any], declared: str, columns=None,
                     keep: list[str] | None = None) -> list[dict[str, Any]]:
    """A shard's rows, each value as the job's column plan types it (so every block agrees); `keep`:
    input.columns (the chosen columns only)."""
    shard = Shard(**{k: item[k] for k in Shard.__dataclass_fields__})
    rows = bio.read_shard(shard, declared, shard.path)
    if keep:
        rows = [hf_input.keep_columns(row, keep) for row in rows]
    for row in rows:
        row["_shard"] = shard.shard_id
        row["_file"] = shard.rel
        if declared == "openai_batch" and "body" in row and not isinstance(row["body"], str):
            row["body"] = json.dumps(row["body"])  # bodies differ in shape: keep them as text in Arrow
        if columns is not None:
            conform_row(row, columns)
    return rows


def wait_for_cluster(spec: JobSpec, console: Console) -> None:
    """Block until the connected cluster has compute.wait_for (nodes joining late); ResourceTimeout
    (a PlanError naming what was seen) after compute.wait_timeout_s."""
    if spec.compute.wait_for is None:
        return
    from fleetllm.cluster.wait import ray_snapshot, wait_until, wanted

    need = wanted(spec.compute.wait_for.gpus, spec.compute.wait_for.cpus)
    wait_until(ray_snapshot, need, timeout_s=spec.compute.wait_timeout_s, log=lambda m: console.print(m))


def engine_pool(plan: JobPlan) -> EnginePool:
    spec = plan.spec
    pending_rows = sum(s.rows for s in plan.pending)
    rows_in_flight = min(plan.in_flight * plan.rows_per_call, -(-pending_rows // max(1, plan.replicas)))
    return EnginePool(engine=plan.engine, model_path=plan.model.path, engine_kwargs=plan.engine_kwargs,
                      replica_plan=plan.replica_plan, batch_size=plan.rows_per_call,
                      in_flight=plan.in_flight, chat_template_kwargs=spec.model.chat_template_kwargs,
                      max_retries=spec.compute.max_retries, task=plan.task,
                      rows_in_flight=max(1, rows_in_flight))


def build_dataset(plan: JobPlan, preprocessor: Callable[[dict], dict]):
    import ray

    spec = plan.spec
    items = [s.to_dict() for s in plan.pending]
    declared = spec.input.format
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.flat_map(_read_shard_rows, fn_kwargs={"declared": declared, "columns": plan.columns,
                                                  "keep": spec.input.columns}, num_cpus=0.25)
    ds = ds.map(preprocessor, num_cpus=0.25)
    # vLLM: chat template + tokenization in tasks here (a whole shard each), off the replicas' critical
    # path. Ray Data gives actor pools max_restarts=-1 and max_task_retries=-1: a crashed replica is
    # restarted and its in-flight batch redone; the assembler drops any re-emitted duplicate.
    return engine_pool(plan).apply(ds)


class ShardAssembler:
    """Collect rows by shard; hand back a shard's table once all its rows have arrived."""

    def __init__(self, shards: list[Shard]) -> None:
        self.expected = {s.shard_id: s.rows for s in shards}
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


def run_job(spec: JobSpec, *, overwrite: bool = False, dry_run: bool = False,
            max_error_rate: float | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run a job; a real run holds the output folder's lock throughout (a second run refuses)."""
    if dry_run:
        return _run_job(spec, overwrite=overwrite, dry_run=True, max_error_rate=max_error_rate, console=console)
    created = folders_to_create(spec.output.path)
    try:
        with OutputFolder(spec.output.path, spec.output.format).lock(overwrite):
            return _run_job(spec, overwrite=overwrite, dry_run=False, max_error_rate=max_error_rate,
                            console=console)
    except BaseException:
        remove_if_empty(created)  # a refused run leaves no folder of its own behind
        raise


def folders_to_create(url: str) -> list[str]:
    """The local folders a run of this output path creates (OUT/_fleetllm, OUT and missing parents),
    deepest first; [] for an object store (no folders there)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return []
    missing, path = [], os.path.join(os.path.abspath(root), "_fleetllm")
    while path and not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_if_empty(folders: list[str]) -> None:
    for folder in folders:  # deepest first; a folder that holds anything stays
        try:
            os.rmdir(folder)
        except OSError:
            return


def timeline(**stamps: float | None) -> dict[str, float]:
    """Each phase's moment, in seconds since fleetllm was imported (where a whole command's time goes:
    imports, planning, the engine's start, generation, the last commit)."""
    import fleetllm

    return {k: round(v - fleetllm.STARTED_AT, 3) for k, v in stamps.items()
            if v is not None and 0 < v < float("inf")}


def _run_job(spec: JobSpec, *, overwrite: bool = False, dry_run: bool = False,
             max_error_rate: float | None = None, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    t0 = time.time()
    if dry_run:  # sized for the cluster when one is named, else for this machine
        address = spec.cluster.address or os.environ.get("RAY_ADDRESS")
        if address:
            init_ray(address)
        plan = plan_job(spec, overwrite=overwrite, dry_run=True,
                        resources=sizing.cluster_resources() if address else None)
        console.print(f"engine: {plan.engine} ({plan.engine_reason})")
        for line in plan.describe():
            print(line)
        return {"dry_run": True, "plan": plan.describe()}
    preflight(spec)  # before Ray starts: what would otherwise fail after minutes, or every row
    from fleetllm.batch import local_run

    in_process = local_run.runs_in_process(spec)
    if in_process:  # one local replica: no Ray (fleetllm.batch.local_run)
        plan = plan_job(spec, overwrite=overwrite, resources=local_run.local_resources_for_run(spec))
    else:  # connect (or start a local Ray), wait for late nodes, then size the replicas to what is there
        c = spec.compute
        spec.environment.check_local()
        init_ray(spec.cluster.address, c.cpus_per_replica * (c.replicas if isinstance(c.replicas, int) else 1),
                 runtime_env=spec.environment.runtime_env())
        wait_for_cluster(spec, console)
        plan = plan_job(spec, overwrite=overwrite, resources=sizing.cluster_resources())
    planned_at = time.time()
    console.print(f"engine: {plan.engine} ({plan.engine_reason}); {plan.replicas} replica(s), "
                  f"{plan.in_flight} batch(es) in flight each")
    out = OutputFolder(spec.output.path, spec.output.format)
    out.remove_report()
    preprocessor = make_preprocessor(spec, plan.task, plan.engine)
    progress = JobProgress(plan.total_rows, plan.skipped_rows, console=console)
    totals = {"rows": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0}
    ready_at: list[float] = []
    by_id = {s.shard_id: s for s in plan.pending}
    writer = shard_writer(spec.output.format)
    t_engine = time.time()  # fallback start of generation when no replica reported readiness
    engine_start_at = t_engine
    first_call, last_done = float("inf"), 0.0  # a replica's first batch started, its last one finished
    last_commit = t_engine  # generation ends when the last shard is committed (not at pool teardown)
    series = RunSeries(t0)  # what `fleetllm report` draws (fleetllm/report/series.py)

    def commit(shard: Shard, table) -> None:
        nonlocal last_commit
        series.batch(table)
        commit_started = time.time()
        entry = _commit_shard(out, plan, shard, table, writer)
        series.commit(entry, commit_started)
        for k in totals:
            totals[k] += getattr(entry, k)
        progress.advance(entry.rows, entry.output_tokens, entry.errors)
        last_commit = time.time()

    try:
        if plan.pending and in_process:
            times = local_run.run_shards(plan, preprocessor, commit)
            ready_at.append(times["ready"])
            first_call, last_done = times["first_call"], times["last_done"]
            engine_start_at = times["engine_start"]
        elif plan.pending:
            ds = build_dataset(plan, preprocessor)
            assembler = ShardAssembler(plan.pending)
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=0):
                if not ready_at and "_ready" in batch.column_names:
                    ready_at.append(min(batch.column("_ready").to_pylist()))
                if "_started" in batch.column_names:
                    first_call = min([first_call, *batch.column("_started").to_pylist()])
                    last_done = max([last_done, *batch.column("_finished").to_pylist()])
                for sid, table in assembler.add(batch):
                    commit(by_id[sid], table)
    except Exception as exc:
        cause = endpoint_cause(exc)
        if cause is None:
            raise
        done = len(out.committed(plan.shards, plan.fingerprint))
        raise EndpointError(f"{cause}. The job stopped: {done} of {len(plan.shards)} shard(s) are committed; "
                            "the rows of the others were not, and the next run computes them") from None
    finally:
        progress.close()
    wall = time.time() - t0
    generation_wall = last_commit - (ready_at[0] if ready_at else t_engine)
    report = make_report(plan, totals, wall, generation_wall, out)
    report["teardown_s"] = round(time.time() - last_commit, 3)  # replicas stopping
    report["in_process"] = in_process  # no Ray: a local job of one replica (fleetllm.batch.local_run)
    if ready_at:
        report["engine_ready_after_start_s"] = round(ready_at[0] - t0, 3)  # command start -> engine ready
    report["timeline_s"] = timeline(t0=t0, planned=planned_at, engine_start=engine_start_at,
                                    engine_ready=ready_at[0] if ready_at else None, first_batch=first_call,
                                    last_batch_done=last_done, last_commit=last_commit, end=time.time())
    report["series"] = series.as_dict(ready_at[0] if ready_at else None, generation_wall, wall)
    if ready_at and first_call < float("inf"):  # engine ready -> its first batch: the pipeline's start-up lag
        report["first_batch_after_ready_s"] = round(first_call - ready_at[0], 3)
        report["commit_after_last_batch_s"] = round(last_commit - last_done, 3)  # output travel + last commit
    writer.finalize(out, plan)
    out.write_report(report)
    rate = report["error_rate"]
    report["ok"] = max_error_rate is None or rate <= max_error_rate
    return report


def preflight(spec: JobSpec) -> None:
    """Checks that need no Ray: the output folder can be written (a local one); an openai endpoint
    accepts the job's key and serves its model (EndpointError otherwise, naming the fix)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(spec.output.path)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        probe = os.path.join(root, ".tmp-write-check")
        try:
            os.makedirs(root, exist_ok=True)
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as exc:
            raise PlanError(f"output.path {spec.output.path!r} cannot be written ({exc.strerror or exc}: "
                            f"{exc.filename or root}); choose a folder you can create and write to") from None
    if spec.model.engine == "openai":
        from fleetllm.engines.openai_http import check_endpoint

        check_endpoint(spec.model.source, spec.model.engine_kwargs)


def endpoint_cause(exc: BaseException) -> str | None:
    """The message of an EndpointError raised in a replica, however Ray wrapped it; else None."""
    seen, marker = set(), "fleetllm.errors.EndpointError: "
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, EndpointError):
            return str(exc)
        text = str(exc)
        if marker in text:  # Ray's task error carries the remote traceback as text
            return text[text.rindex(marker) + len(marker):].strip().splitlines()[0]
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    return None


def make_preprocessor(spec: JobSpec, task: str = "generate", engine: str | None = None) -> Callable[[dict], dict]:
    sampling = spec.sampling.request_params(engine)
    if spec.input.format == "openai_batch":
        from fleetllm.batch.openai_batch import OpenAIBatchPreprocessor

        return OpenAIBatchPreprocessor(sampling, task)
    if task == "embed":
        from fleetllm.batch.embed_stage import EmbedPreprocessor

        return EmbedPreprocessor(spec.prompt.template, spec.input.id_column)
    return TemplatePreprocessor(spec.prompt.system, spec.prompt.template, sampling,
                                spec.input.id_column)


def _commit_shard(out: OutputFolder, plan: JobPlan, shard: Shard, table, writer) -> ManifestEntry:
    import pyarrow.compute as pc

    errors = table.num_rows - table.column("error").null_count
    node_ids = sorted(set(table.column("_node").to_pylist())) if "_node" in table.column_names else []
    entry = ManifestEntry(
        shard=shard.shard_id, file=part_name(shard.shard_id, out.fmt), rows=table.num_rows, errors=errors,
        input_tokens=int(pc.sum(table.column("num_input_tokens")).as_py() or 0),
        output_tokens=int(pc.sum(table.column("num_generated_tokens")).as_py() or 0)
        if "num_generated_tokens" in table.column_names else 0,
        fingerprint=shard_fingerprint(plan.fingerprint, shard), nodes=[n for n in node_ids if n])
    drop = [c for c in INTERNAL_COLUMNS if c in table.column_names]
    if plan.spec.prompt.template and "messages" in table.column_names:
        drop.append("messages")
    if plan.task == "embed" and "num_generated_tokens" in table.column_names:
        drop.append("num_generated_tokens")  # an embedding generates nothing
    data = _fixed_types(conform_table(table.drop_columns(drop), plan.columns))
    if plan.task == "embed":
        from fleetllm.batch.embed_stage import fixed_size_embedding

        data = fixed_size_embedding(data, plan.embedding_dims)
    out.commit(entry, lambda fh: writer.write(fh, data))
    return entry


OUTPUT_TYPES = {"row_id": "string", "generated_text": "string", "num_input_tokens": "int64",
                "num_generated_tokens": "int64", "finish_reason": "string", "error": "string", "attempts": "int64",
                "parsed": "string"}
# Columns the stages write: an input column of the same name is replaced, so it is not planned.
WRITTEN_COLUMNS = (*OUTPUT_TYPES, "completions", "logprobs")


def _fixed_types(table):
    """Output columns get fixed types, so shards whose rows all lack a value (a null column) still
    share one schema with the others."""
    import pyarrow as pa

    for name, typ in OUTPUT_TYPES.items():
        if name in table.column_names:
            i = table.column_names.index(name)
            table = table.set_column(i, name, table.column(name).cast(pa.type_for_alias(typ)))
    return table


def make_report(plan: JobPlan, totals: dict[str, int], wall: float, generation_wall: float,
                out: OutputFolder) -> dict[str, Any]:
    from importlib.metadata import version

    committed = out.committed(plan.shards, plan.fingerprint)
    rows_total = sum(e.rows for e in committed.values())
    errors_total = sum(e.errors for e in committed.values())
    nodes = sorted({n for e in committed.values() for n in e.nodes})
    return {
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
        "fingerprint": plan.fingerprint,
        "versions": {"fleetllm": __version__, "ray": version("ray"), "python": platform.python_version()},
        "spec": json.loads(plan.spec.model_dump_json()),
    }
