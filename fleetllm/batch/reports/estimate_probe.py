"""`fleetllm calibrate JOB.yaml`: a short probe of the job's engine on this machine. It plans the job
(writing nothing to its output folder), starts one replica's engine in this process, and runs the
job's first rows through it in calls of growing size (1, 2, 4, ... up to the rows a replica holds at
once), every other call with its max_tokens cut to a quarter, then a few calls of fixed shapes
(SHAPE_CALLS: long prompts with short outputs, forced long outputs at batch 1 and at the full batch),
and one call of short prompts at the sequences the run's engine will hold at once (vLLM's own default on
this accelerator, known once the engine is up), so the fit sees the step time at several batch sizes,
context lengths and numbers of steps, whatever the job's own shape. The calls, the engine's start-up, its
default max_num_seqs and the output lengths are added to the profile and the job's lengths under
$FLEETLLM_HOME (fleetllm.estimate.store); later estimates and runs reuse them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from fleetllm.batch.reports.estimate_job import (
    batching,
    estimate_plan,
    job_key,
    layout,
    profile_key,
)
from fleetllm.engines.capabilities import capabilities
from fleetllm.errors import PlanError
from fleetllm.estimate import store
from fleetllm.estimate.estimate import PROBE_ROWS
from fleetllm.estimate.observe import call_from_rows, group_calls, output_lengths, split_call


def call_sizes(rows: int, cap: int) -> list[int]:
    """1, 2, 4, ... up to `cap` rows per call, then calls of `cap` until `rows` are used."""
    sizes, size, left = [], 1, rows
    while left > 0:
        take = min(size, cap, left)
        sizes.append(take)
        left -= take
        size = min(size * 2, cap)
    return sizes


def probe_rows(plan, rows: int) -> list[dict]:
    """The job's first `rows` rows, preprocessed as the job does."""
    from fleetllm.batch.runner import make_preprocessor
    from fleetllm.batch.inputs.shard_rows import read_shard_rows

    pre = make_preprocessor(plan.spec, plan.task, plan.engine, plan.reads_images)
    picked: list[dict] = []
    for shard in plan.shards:
        picked += [pre(r) for r in read_shard_rows(shard.to_dict(), plan.read_format, plan.columns,
                                                    plan.spec.input.columns)]
        if len(picked) >= rows:
            break
    return picked[:rows]


def call_table(plan, rows: list[dict], cap: int | None):
    """A call's rows as the engine stage takes them (tokenized ahead where the engine takes ids), their
    max_tokens cut to `cap` when given: calls of fewer steps, so the fit tells a step's cost from a
    call's."""
    from fleetllm.batch.planning.job_plan import engine_pool
    from fleetllm.batch.execution.stages import table_from_rows

    # each row's sampling spelled out (its own or the job's): the returned rows tell their `n`
    rows = [{**r, "sampling_params": json.dumps({**sampling_of(r, plan), **({"max_tokens": cap} if cap else {})})}
            for r in rows]
    table = table_from_rows(rows)
    for fn, kwargs in engine_pool(plan).table_stages():  # the job's own stages before the engine
        table = fn(table, **kwargs["fn_kwargs"])
    return table


# Calls of fixed shapes beside the job's own: (rows: share of the replica's batch, prompt characters at
# least, output tokens forced with min_tokens). They make the profile the engine's, not the job's: a
# long-answer job's probe must still tell what a prefill-heavy job will take, and the other way round.
SHAPE_CALLS = ((0.0, 0, 48), (1.0, 0, 48), (1.0, 2000, 4), (0.5, 1000, 24))
# Then one call at the sequences the engine holds at once in the run (vLLM's default is 1,024 on an H100: the
# decode step is compute-bound there, memory-bound at the probe's smaller calls), of short prompts and
# FULL_BATCH_TOKENS out each, so the fit sees the step time at the run's batch and does not extrapolate to it.
FULL_BATCH_CHARS, FULL_BATCH_TOKENS, FULL_BATCH_MAX = 400, 32, 4096
# And the same batch over a long context: one shared prefix of LONG_CONTEXT_CHARS (at most half the model's context)
# before each row's short prompt. The prefix cache computes it once, but every decode step attends over it for every
# sequence: the step's cost of context at the run's batch (lease 14: a probe without it fitted none, and a1024's decode
# at 1,024 x ~384 tokens ran 39 ms a step where the fit said 28)
LONG_CONTEXT_CHARS = 4000


def shaped(row: dict, min_chars: int, out: int, plan, max_chars: int | None = None, prefix: str = "") -> dict:
    """The row with its prompt repeated to at least `min_chars` characters (or cut to `max_chars`), after
    `prefix`, and exactly `out` tokens out."""
    row = dict(row)
    row["sampling_params"] = json.dumps({**sampling_of(row, plan), "max_tokens": out, "min_tokens": out})

    def fit(text: str) -> str:
        text = "\n".join([text] * max(1, -(-min_chars // max(1, len(text)))))
        return prefix + (text[:max_chars] if max_chars else text)

    if row.get("_messages"):
        messages = json.loads(row["_messages"])
        if isinstance(messages[-1].get("content"), str) or not messages[-1].get("content"):
            messages[-1] = {**messages[-1], "content": fit(str(messages[-1].get("content") or "x"))}
        row["_messages"] = json.dumps(messages, ensure_ascii=False)
    elif row.get("prompt"):
        row["prompt"] = fit(row["prompt"])
    return row


def sampling_of(row: dict, plan) -> dict:
    """The sampling a row runs with (its own, else the job's), max_tokens always set."""
    from fleetllm.batch.execution.stages import row_sampling

    sp = row_sampling(row, plan.request_sampling())
    sp.setdefault("max_tokens", plan.spec.sampling.max_tokens)
    return sp


def probe_calls(stage, plan, picked: list[dict], sizes: list[int], kind: str) -> tuple[list, list[int]]:
    """Run the probe's calls through the started stage: (the observed calls, the job's output lengths)."""
    calls, lengths, at = [], [], 0
    stage(call_table(plan, picked[:1], None))  # warm-up: first-call costs a run pays once, not per call
    for i, size in enumerate(sizes):  # every other call cut to a quarter of its max_tokens
        full = max(sampling_of(r, plan)["max_tokens"] for r in picked[at:at + size])
        cap = max(2, full // 4) if i % 2 else None
        out, observed = clocked(stage, call_table(plan, picked[at:at + size], cap), kind)
        at += size
        calls += observed
        if cap is None:  # the job's own lengths
            lengths += output_lengths(out)
    cap_rows = max(sizes)
    shapes = [(max(1, round(share * cap_rows)), chars, tokens, None, "") for share, chars, tokens in SHAPE_CALLS]
    held = layout(plan, default_seqs=stage.engine.default_max_num_seqs).concurrency  # as the run will hold
    if min(held, FULL_BATCH_MAX) > cap_rows:
        full = min(held, FULL_BATCH_MAX)
        shapes += [(full, 0, FULL_BATCH_TOKENS, FULL_BATCH_CHARS, ""),
                   (full, 0, FULL_BATCH_TOKENS, FULL_BATCH_CHARS, long_prefix(picked, stage.engine.max_model_len))]
    for n, chars, tokens, most, prefix in shapes:
        rows_of_shape = [shaped(picked[i % len(picked)], chars, tokens, plan, most, prefix) for i in range(n)]
        calls += clocked(stage, call_table(plan, rows_of_shape, None), kind)[1]
    return calls, lengths


def long_prefix(picked: list[dict], max_model_len: int | None) -> str:
    """LONG_CONTEXT_CHARS of the probe's own rows' text (at most half the model's context: a token is a character
    at least), a shared prefix for the long-context call."""
    texts = [str(r.get("prompt") or r.get("_messages") or "") for r in picked] or ["x"]
    size = min(LONG_CONTEXT_CHARS, (max_model_len or 2 * LONG_CONTEXT_CHARS) // 2)
    text = "\n".join(texts)
    return ("\n".join([text] * max(1, -(-size // max(1, len(text))))))[:size] + "\n"


def clocked(stage, table, kind: str) -> tuple[list[dict], list]:
    """Run one call through the stage: its rows, and its observations (a static batch's split at its first
    token where the engine clocks its batches: fleetllm.estimate.observe.split_call)."""
    stage.engine.take_generate_timings()  # forget batches run before this call
    out = stage(table).to_pylist()
    groups = group_calls(out)
    timings = stage.engine.take_generate_timings()
    if len(groups) == 1 and timings:
        return out, split_call(call_from_rows(groups[0], kind), timings)
    return out, [call_from_rows(c, kind) for c in groups]


def calibrate(spec, rows: int = PROBE_ROWS) -> dict[str, Any]:
    """Probe the job's engine; returns what was measured and the job's estimate from the new profile."""
    from fleetllm.batch.planning.job_plan import engine_pool, plan_job
    from fleetllm.batch.planning.job_prepare import fetch_models
    from fleetllm.batch.execution.local_run import local_resources_for_run

    t_plan = time.time()
    fetch_models(spec)  # the probe's engine loads the model and adapters as a run's does
    plan = plan_job(spec, resources=local_resources_for_run(spec))
    can = capabilities(plan.engine)
    if plan.task != "generate" or can.is_endpoint:
        raise PlanError(f"fleetllm calibrate measures a local engine generating text; this job is "
                        f"{'an embed job' if plan.task != 'generate' else 'against an endpoint (engine openai)'}: "
                        "its rate is measured while it runs")
    picked = probe_rows(plan, rows)
    plan_s = time.time() - t_plan
    if not picked:
        raise PlanError(f"the job's input {spec.input.path!r} has no rows to probe")
    kind = batching(plan.engine)
    sizes = call_sizes(len(picked), max(1, layout(plan).concurrency))
    for name, value in can.clock_engine_kwargs:  # the probe's engine clocks its calls (the profile key stays the run's)
        plan.engine_kwargs.setdefault(name, value)
    pool = engine_pool(plan)
    if can.forks_engine_core:  # as a local run: a plain process may fork vLLM's engine core
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    t_start = time.time()
    stage = pool.stage_class()(**pool.stage_kwargs(), node_id="probe")  # configured as the job's replicas
    startup = time.time() - t_start
    try:
        calls, lengths = probe_calls(stage, plan, picked, sizes, kind)
    finally:
        t_stop = time.time()
        stage.engine.stop()
        stop_s = time.time() - t_stop
    key = profile_key(plan)
    profile = store.load_profile(key) or store.Profile(key, kind)
    profile.max_model_len = stage.engine.max_model_len or profile.max_model_len
    profile.max_num_seqs = stage.engine.default_max_num_seqs or profile.max_num_seqs
    profile.prefix_block = stage.engine.prefix_block_tokens or profile.prefix_block
    profile.add(calls, {"kind": "probe", "job": spec.name, "rows": len(picked)}, startup, plan_s + stop_s,
                stage.engine.start_compile_s)
    path = store.save_profile(profile)
    store.save_lengths(job_key(plan), lengths, "probe", spec.name)
    rates = profile.rates()
    return {"profile": str(path), "key": key, "calls": [c.to_dict() for c in calls], "startup_s": round(startup, 2),
            "fit": rates.as_dict(), "prefill_tokens_per_s": rates.prefill_tokens_per_s(),
            "decode_tokens_per_s": {b: round(rates.decode_tokens_per_s(b, 512), 1) for b in (1, 8, 32, 128)},
            "estimate": estimate_plan(plan)}
