"""`fleetllm run`: plan, prepare, stream the shards through engine replicas, assemble and commit, report.

    fetch_models -> plan_job (fleetllm.batch.planning.job_plan, pure: engine, replicas, shards, what is committed
    already) -> prepare (the output folder's records, under its lock; `--dry-run` stops before it)
    -> run the pending shards: on Ray Data (fleetllm.batch.execution.stream), or for a local job of one replica
       in this process without Ray (fleetllm.batch.execution.local_run: its engine starts while the first
       shards are read and tokenized); both hand each complete shard back to this driver
    -> commit_shard (fleetllm.batch.output.assemble: the data under its final name, then one commit object per
       shard under OUT/_fleetllm/commits)
    -> make_report (fleetllm.batch.reports.job_report: the run record, _SUCCESS)

The driver never holds more than the shards in flight; the commit objects make the job resumable.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any, Callable

from rich.console import Console

from fleetllm import sizing
from fleetllm.batch.output import owner, store
from fleetllm.batch.output.assemble import commit_shard
from fleetllm.batch.output.commit import OutputFolder
from fleetllm.batch.reports.estimate_job import apply_deadline, estimate_plan, job_shape
from fleetllm.batch.reports.estimate_live import RunEstimate
from fleetllm.batch.planning.job_plan import JobPlan, plan_job
from fleetllm.batch.planning.job_prepare import fetch_models, prepare
from fleetllm.batch.reports.job_report import make_report
from fleetllm.batch.planning.shards import Shard
from fleetllm.batch.reports.progress import JobProgress
from fleetllm.batch.output.retry_errors import commit_retried, reopen_errors
from fleetllm.batch.reports.run_series import RunSeries
from fleetllm.batch.execution.stages import TemplatePreprocessor
from fleetllm.batch.execution.stream import init_ray, release_cluster_request, run_on_ray, wait_for_cluster
from fleetllm.batch.output.writers import shard_writer
from fleetllm.engines.capabilities import capabilities, declared
from fleetllm.errors import EndpointError, PlanError
from fleetllm.estimate.describe import describe as describe_estimate
from fleetllm.spec import JobSpec


def run_job(spec: JobSpec, *, overwrite: bool = False, dry_run: bool = False,
            max_error_rate: float | None = None, console: Console | None = None,
            retry_errors: str | None = None, as_json: bool = False) -> dict[str, Any]:
    """Run a job; a real run holds the output folder's lock throughout (a second run refuses).
    `retry_errors` ("all" or "retryable"): also recompute the committed rows whose `error` is set
    (fleetllm.batch.output.retry_errors). A dry run prints the plan and its estimate (`as_json`: prints
    nothing, the caller prints the returned dict)."""
    if retry_errors is not None and overwrite:
        raise PlanError("--retry-errors recomputes the failed rows of the existing output and --overwrite "
                        "recomputes every row: give one of them")
    if dry_run:
        return _dry_run(spec, overwrite=overwrite, console=console or Console(stderr=True), as_json=as_json)
    swept = owner.sweep_temp()  # temporary folders of killed runs (fleetllm.batch.output.owner)
    if swept and console is not None:
        console.print(f"removed {len(swept)} temporary folder(s) left by killed runs: {', '.join(swept[:3])}"
                      + (" ..." if len(swept) > 3 else ""))
    created = folders_to_create(spec.output.path)
    try:
        with OutputFolder(spec.output.path, spec.output.format).lock(overwrite):
            try:
                return _run_job(spec, overwrite=overwrite, dry_run=False, max_error_rate=max_error_rate,
                                console=console, retry_errors=retry_errors)
            finally:
                release_cluster_request(spec)
    except OSError as exc:
        remove_if_empty(created)
        full = disk_full(exc, spec.output.path)
        if full is None:
            raise
        raise full from None
    except BaseException:
        remove_if_empty(created)  # a refused run leaves no folder of its own behind
        raise


def disk_full(exc: OSError, url: str) -> PlanError | None:
    """The one message of a run stopped by a full disk (or quota): the folder, what is committed (kept,
    whole) and what to do; None for any other error."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    out = OutputFolder(url, "parquet")
    try:
        commits = out.read_commits()
    except OSError:
        commits = {}
    rows = sum(e.rows for e in commits.values())
    path = os.path.abspath(str(exc.filename)) if exc.filename else None
    if path and store.is_local(out.fs) and os.path.commonpath([path, os.path.abspath(out.root)]) != \
            os.path.abspath(out.root):  # another disk filled (a temporary folder's): name that one
        disk, fix = f"the disk holding {path!r}", "that disk"
    else:
        disk, fix = f"the disk of output folder {url!r}", "that disk (or move output.path to a larger one)"
    return PlanError(f"{disk} is full ({exc.strerror}); {len(commits)} shard(s) ({rows} rows) are committed in "
                     f"{url!r} and kept, and nothing partial was left. Free space on {fix} and run the same "
                     "command again: it resumes after the committed shards")


def folders_to_create(url: str) -> list[str]:
    """The local folders a run of this output path creates (OUT/_fleetllm, OUT and missing parents),
    deepest first; [] for an object store (no folders there)."""
    fs, root = store.open_url(url)
    if not store.is_local(fs):
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
             max_error_rate: float | None = None, console: Console | None = None,
             retry_errors: str | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    t0 = time.time()
    preflight(spec)  # before Ray starts: what would otherwise fail after minutes, or every row
    from fleetllm.batch.execution import local_run

    in_process = local_run.runs_in_process(spec)
    plan = prepare(_plan_where_it_runs(spec, in_process, overwrite, console))  # the folder's records written
    out = OutputFolder(spec.output.path, spec.output.format)
    if retry_errors is not None:
        rows = reopen_errors(plan, out, retry_errors)
        console.print(f"--retry-errors {retry_errors}: {rows} failed row(s) of the output are computed again")
    estimate = run_estimate(plan, t0, console)
    planned_at = time.time()
    _say_the_plan(plan, console)
    out.remove_report()
    preprocessor = make_preprocessor(spec, plan.task, plan.engine, plan.reads_images)
    progress = JobProgress(plan.total_rows, plan.skipped_rows, console=console,
                           eta=estimate.eta if estimate is not None else None)
    totals = {"rows": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0}
    ready_at: list[float] = []
    writer = shard_writer(spec.output.format)
    t_engine = time.time()  # fallback start of generation when no replica reported readiness
    engine_start_at = t_engine
    first_call, last_done = float("inf"), 0.0  # a replica's first batch started, its last one finished
    last_commit = t_engine  # generation ends when the last shard is committed (not at pool teardown)
    series = RunSeries(t0)  # what `fleetllm report` draws (fleetllm/batch/reports/run_series.py)

    def commit(shard: Shard, table) -> None:
        nonlocal last_commit
        series.batch(table)
        with progress.lock:  # a tick thread may be reading the estimate (Ray path)
            estimate is not None and estimate.observe(table)
        commit_started = time.time()
        entry = (commit_shard if shard.only_lines is None else commit_retried)(out, plan, shard, table, writer)
        series.commit(entry, commit_started)
        for k in totals:
            totals[k] += getattr(entry, k)
        progress.advance(entry.rows, entry.output_tokens, entry.errors, entry.input_tokens, entry.cached_tokens)
        last_commit = time.time()

    # an engine in this process says its waits
    listen = progress.waiting if capabilities(plan.engine).is_endpoint else None
    if listen is not None:
        from fleetllm.engines.openai.client import wait_listeners

        wait_listeners.append(listen)
    try:
        if plan.pending:  # one local replica: no Ray (fleetllm.batch.execution.local_run); else the Ray Data stream
            # the live ETA reads the engines' progress (estimate_live.RunEstimate.watch), between commits too
            watch, tick = (estimate.watch, progress.refresh) if estimate is not None else (None, None)
            run = local_run.run_shards if in_process else run_on_ray
            times = run(plan, preprocessor, commit, watch, tick)
            if times["ready"] < float("inf"):
                ready_at.append(times["ready"])
            first_call, last_done = times["first_call"], times["last_done"]
            engine_start_at = times.get("engine_start", engine_start_at)
    except Exception as exc:
        cause = endpoint_cause(exc)
        if cause is None:
            raise
        done = len(out.committed(plan.shards, plan.fingerprint))
        raise EndpointError(f"{cause}. The job stopped: {done} of {len(plan.shards)} shard(s) are committed; "
                            "the rows of the others were not, and the next run computes them") from None
    finally:
        if listen is not None:
            wait_listeners.remove(listen)
        progress.close()
    report = _timed_report(plan, totals, out, series, in_process, t0=t0, planned_at=planned_at, t_engine=t_engine,
                           engine_start_at=engine_start_at, ready_at=ready_at, first_call=first_call,
                           last_done=last_done, last_commit=last_commit)
    if estimate is not None:
        estimate.finish(report)  # run.json: the estimate at the start beside what happened; the profile learns
    writer.finalize(out, plan)
    out.write_report(report)
    rate = report["error_rate"]
    report["ok"] = max_error_rate is None or rate <= max_error_rate
    return report


def _plan_where_it_runs(spec: JobSpec, in_process: bool, overwrite: bool, console: Console) -> JobPlan:
    """The job's plan, sized to where it runs: this process (one local replica, no Ray) or the Ray cluster,
    connected (or a local Ray started) and waited for (compute.wait_for) first; its models fetched first."""
    from fleetllm.batch.execution import local_run

    fetch_models(spec)
    if in_process:  # one local replica: no Ray (fleetllm.batch.execution.local_run)
        return plan_job(spec, overwrite=overwrite, resources=local_run.local_resources_for_run(spec))
    # connect (or start a local Ray), wait for late nodes, then size the replicas to what is there
    compute = spec.compute
    spec.environment.check_local()
    replicas = compute.replicas if isinstance(compute.replicas, int) else 1
    init_ray(spec.cluster.address, compute.cpus_per_replica * replicas, runtime_env=spec.environment.runtime_env())
    wait_for_cluster(spec, console)
    return plan_job(spec, overwrite=overwrite, resources=sizing.cluster_resources())


def _say_the_plan(plan: JobPlan, console: Console) -> None:
    """The engine and replicas chosen, and the input files changed since the last run."""
    console.print(f"engine: {plan.engine} ({plan.engine_reason}); {plan.replicas} replica(s), "
                  f"{plan.in_flight} batch(es) in flight each")
    if plan.changed_files:
        console.print(f"input changed since the last run: {', '.join(plan.changed_files)}; "
                      "the shards whose rows changed are computed again")


def _timed_report(plan: JobPlan, totals: dict[str, int], out: OutputFolder, series: RunSeries, in_process: bool, *,
                  t0: float, planned_at: float, t_engine: float, engine_start_at: float, ready_at: list[float],
                  first_call: float, last_done: float, last_commit: float) -> dict[str, Any]:
    """The job's report (make_report) with where the time went: wall and generation time, the timeline of
    its phases, the series `fleetllm report` draws, the start-up lag and the last commit's travel."""
    wall = time.time() - t0
    generation_wall = last_commit - (ready_at[0] if ready_at else t_engine)
    report = make_report(plan, totals, wall, generation_wall, out)
    report["teardown_s"] = round(time.time() - last_commit, 3)  # replicas stopping
    report["changed_files"] = plan.changed_files  # input files whose content differs from the last run's
    report["in_process"] = in_process  # no Ray: a local job of one replica (fleetllm.batch.execution.local_run)
    if ready_at:
        report["engine_ready_after_start_s"] = round(ready_at[0] - t0, 3)  # command start -> engine ready
    report["timeline_s"] = timeline(t0=t0, planned=planned_at, engine_start=engine_start_at,
                                    engine_ready=ready_at[0] if ready_at else None, first_batch=first_call,
                                    last_batch_done=last_done, last_commit=last_commit, end=time.time())
    report["series"] = series.as_dict(ready_at[0] if ready_at else None, generation_wall, wall)
    if ready_at and first_call < float("inf"):  # engine ready -> its first batch: the pipeline's start-up lag
        report["first_batch_after_ready_s"] = round(first_call - ready_at[0], 3)
        report["commit_after_last_batch_s"] = round(last_commit - last_done, 3)  # output travel + last commit
    return report


def run_estimate(plan, t0: float, console: Console) -> RunEstimate | None:
    """compute.deadline applied to the plan (refused here, before any engine starts), and the estimate
    the run keeps (generate jobs; fleetllm.batch.reports.estimate_live)."""
    if plan.task != "generate":
        return None
    shape = None
    if plan.spec.compute.deadline:  # the deadline needs the job's tokens now; else made at the first commit
        shape = job_shape(plan)
        deadline = apply_deadline(plan, shape)
        console.print(f"deadline: {deadline['why']}")
        if deadline.get("scale_up"):  # more replicas than fit now: the autoscaler starts nodes for the rest
            from fleetllm.ray_resources import request_from_autoscaler

            grow = deadline["scale_up"]
            request_from_autoscaler(grow["resources"])  # withdrawn when the job ends (release_cluster_request)
            console.print(f"deadline: {plan.replicas} replicas, {grow['replicas_now']} fit now; asked the "
                          f"cluster's autoscaler for {grow['resources']}")
    return RunEstimate(plan, t0, shape)


def _dry_run(spec: JobSpec, *, overwrite: bool, console: Console, as_json: bool) -> dict[str, Any]:
    """Sized for the cluster when one is named, else for this machine; deadline applied; the estimate."""
    address = spec.cluster.address or os.environ.get("RAY_ADDRESS")
    if address:
        init_ray(address)
    plan = plan_job(spec, overwrite=overwrite, resources=sizing.cluster_resources() if address else None)
    shape = job_shape(plan) if plan.task == "generate" else None
    deadline = apply_deadline(plan, shape)
    est = estimate_plan(plan, shape) if shape is not None else None
    lines = plan.describe() + (describe_estimate(est) if est else [])
    if not as_json:
        console.print(f"engine: {plan.engine} ({plan.engine_reason})")
        for line in lines:
            print(line)
    return {"dry_run": True, "plan": lines, "replicas": plan.replicas, "estimate": est, "deadline": deadline}


def preflight(spec: JobSpec) -> None:
    """Checks that need no Ray: the output folder can be written (a local one); an openai endpoint
    accepts the job's key and serves its model (EndpointError otherwise, naming the fix)."""
    if not (spec.cluster.address or os.environ.get("RAY_ADDRESS")):
        spec.environment.check_refs_set()  # a local run: Secret references must be set here
    fs, root = store.open_url(spec.output.path)
    if store.is_local(fs):
        probe = os.path.join(root, ".tmp-write-check")
        try:
            os.makedirs(root, exist_ok=True)
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as exc:
            raise PlanError(f"output.path {spec.output.path!r} cannot be written ({exc.strerror or exc}: "
                            f"{exc.filename or root}); choose a folder you can create and write to") from None
    if declared(spec.model.engine).is_endpoint:
        from fleetllm.engines.openai.engine import check_endpoint

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


def make_preprocessor(spec: JobSpec, task: str = "generate", engine: str | None = None,
                      reads_images: bool = False) -> Callable[[dict], dict]:
    """The job's row preprocessor. `reads_images`: the local model reads images (JobPlan.reads_images), so the
    image parts of OpenAI Batch lines go to the image stage; on engine openai they go to the endpoint as they
    are (it fetches them, or refuses them as a 400 that is the row's error)."""
    if spec.input.format == "openai_batch":  # the job's sampling: every line's defaults, its body overrides them
        from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor

        return OpenAIBatchPreprocessor(spec.sampling.request_params(engine), task, tuple(spec.model.lora_adapters),
                                       reads_images or declared(engine).is_endpoint)
    if task == "embed":
        from fleetllm.batch.execution.embed_stage import EmbedPreprocessor

        return EmbedPreprocessor(spec.prompt.template, spec.input.id_column)
    return TemplatePreprocessor(spec.prompt.system, spec.prompt.template,
                                spec.input.id_column, spec.prompt.image_column, spec.model.adapter_column,
                                tuple(spec.model.lora_adapters))
