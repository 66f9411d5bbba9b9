"""Estimates on real jobs (issue 37): `fleetllm run --dry-run --json` with and without a profile, a
run that keeps its estimate in its run record (_SUCCESS) and teaches the profile, and compute.deadline sizing or
refusing a plan. The tiny random-weight model on the transformers engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetllm.batch.reports.estimate_job import (
    apply_deadline,
    cached_tokens,
    estimate_plan,
    job_shape,
    layout,
    profile_key,
)
from fleetllm.batch.reports.estimate_probe import call_sizes, shaped
from fleetllm.batch.planning.job_plan import plan_job
from fleetllm.cli import main
from fleetllm.errors import PlanError
from fleetllm.estimate import store
from fleetllm.estimate.deadline import DeadlineError
from fleetllm.estimate.model import STATIC, Call
from fleetllm.spec import JobSpec


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_job(tmp_path, tiny_model, rows: int = 24, **compute) -> tuple[str, dict]:
    import yaml

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"question number {i} about " + "word " * (i % 7)}) + "\n"
                            for i in range(rows)))
    job = {"name": "est", "model": {"source": tiny_model, "engine": "transformers"},
           "input": {"path": str(data), "id_column": "id"}, "prompt": {"template": "{text}"},
           "sampling": {"max_tokens": 8, "temperature": 0.0},
           "output": {"path": str(tmp_path / "out"), "format": "jsonl", "shard_rows": 4},
           "compute": {"batch_size": 4, **compute}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path), job


def dry_run_json(path: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["run", path, "--dry-run", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def synthetic_profile(plan, per_seq_step: float) -> None:
    """A profile whose calls take 0.01 s per step + `per_seq_step` per sequence-step (+ prefill)."""
    calls = []
    for rows in (1, 2, 4, 8):
        for out in (4, 8, 16):
            c = Call(1, rows * 20, out, rows * out, rows * out * 24, 0.0)
            calls.append(Call(1, c.prefill_tokens, c.steps, c.seq_steps, c.ctx_steps,
                              0.02 + 0.001 * c.prefill_tokens + 0.01 * out + per_seq_step * rows * out))
    profile = store.Profile(profile_key(plan), STATIC)
    profile.add(calls, {"kind": "test"}, startup_s=5.0)
    store.save_profile(profile)


def test_dry_run_json_counts_prompt_tokens_and_says_no_profile(home, tmp_path, tiny_model, capsys):
    from transformers import AutoTokenizer

    path, job = write_job(tmp_path, tiny_model)
    out = dry_run_json(path, capsys)
    est = out["estimate"]
    assert est["wall_s"] is None and est["no_profile"]["probe"]["rows"] == 24
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(x) for x in Path(job["input"]["path"]).read_text().splitlines()]
    expected = sum(len(tok(tok.apply_chat_template([{"role": "user", "content": r["text"]}], tokenize=False,
                                                   add_generation_prompt=True), add_special_tokens=False)["input_ids"])
                   for r in rows)
    assert est["prompt_tokens"] == expected and est["prompt_tokens_how"].startswith("counted")
    assert est["output_tokens"] == 24 * 8 and est["range"]["output_tokens"] == [24 * 2, 24 * 8]

    plan = plan_job(JobSpec.model_validate(job))
    synthetic_profile(plan, 0.002)
    est = dry_run_json(path, capsys)["estimate"]
    assert est["wall_s"] > 5.0 and est["range"]["wall_s"][0] < est["wall_s"] < est["range"]["wall_s"][1]
    assert est["gpu_hours"] == 0.0 and est["profile"]


def test_deadline_sizes_replicas_or_is_refused_with_the_figures(home, tmp_path, tiny_model):
    _, job = write_job(tmp_path, tiny_model, rows=400, replicas="auto", cpus_per_replica=1)
    spec = JobSpec.model_validate({**job, "compute": {**job["compute"], "deadline": "10h"}})
    plan = plan_job(spec, resources={"CPU": 8})
    synthetic_profile(plan, 0.05)  # 400 rows x 8 steps x 4-row calls: minutes on one replica
    shape = job_shape(plan)
    with pytest.raises(PlanError, match="needs a throughput profile"):
        store.profile_path(profile_key(plan)).unlink()
        apply_deadline(plan, shape)
    synthetic_profile(plan, 0.05)
    assert apply_deadline(plan, shape)["replicas"] == 1 and plan.replicas == 1  # 10h: one is enough
    spec.compute.deadline = "60s"
    plan = plan_job(spec, resources={"CPU": 8})
    chosen = apply_deadline(plan, shape)
    assert 1 < chosen["replicas"] < 8 and plan.replicas == chosen["replicas"]
    assert "no run on Ray has measured" in chosen["startup_note"]  # several replicas run on Ray: start not measured
    assert any("deadline 60s" in line for line in plan.describe())
    plan = plan_job(spec, resources={"CPU": 2.5})  # two replicas of one CPU, and the stream's 0.5
    with pytest.raises(DeadlineError, match=r"cannot be met: 1m00s left, and with the most replicas the cluster "
                                            r"allows \(2\).*meeting it needs \d+ replicas"):
        apply_deadline(plan, shape)


def test_run_keeps_its_estimate_and_teaches_the_profile(home, tmp_path, tiny_model, capsys):
    path, _ = write_job(tmp_path, tiny_model, rows=24)
    assert main(["run", path]) == 0
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())  # the run record
    est = report["estimate"]
    assert est["at_start"]["rows"] == 24 and est["at_start"]["wall_s"] is None  # no profile before this run
    assert est["actual"]["output_tokens"] == report["output_tokens_computed"]
    assert est["eta_log"]["points"] and est["eta_log"]["points"][-1][1] == 24
    profile = json.loads(next((home / "profiles").glob("*.json")).read_text())
    source = profile["sources"][-1]
    assert source["kind"] == "run" and profile["calls"]
    # the start is kept by where the run ran: in this process, or on Ray (an earlier test of the session left Ray up)
    assert profile["startup_ray_s" if source["executor"] == "ray" else "startup_s"], profile
    after = dry_run_json(path, capsys)["estimate"]
    assert after["wall_s"] is not None and "previous run" in after["output_tokens_how"]


def test_the_prefix_block_is_the_profiled_engines_else_vllms_default_there(home, tmp_path, tiny_model):
    from fleetllm.batch.reports.estimate_job import prefix_block

    _, job = write_job(tmp_path, tiny_model)
    plan = plan_job(JobSpec.model_validate(job), resources={"CPU": 2})
    assert prefix_block(plan) == 128  # no profile, CPU replicas: vLLM's CPU backend default
    profile = store.Profile(profile_key(plan), "continuous", prefix_block=32)
    store.save_profile(profile)
    assert prefix_block(plan) == 32


def test_prefix_cache_and_probe_sizes():
    doc = list(range(40))
    assert cached_tokens([doc + [1, 2], doc + [3, 4], doc + [5]]) == 2 * 32  # whole 16-token blocks, repeats only
    assert cached_tokens([doc, doc]) == 32  # never the whole prompt (its last block is computed again)
    system = list(range(100))  # vLLM's CPU backend keeps 128-token blocks: a 100-token shared prefix is never reused
    assert cached_tokens([system + [i] * 60 for i in range(3)], block=128) == 0
    assert cached_tokens([system + [i] * 60 for i in range(3)]) == 2 * 96
    assert call_sizes(12, 4) == [1, 2, 4, 4, 1]
    assert call_sizes(3, 16) == [1, 2]


def test_the_estimate_holds_as_many_sequences_as_the_profiled_engine(home, tmp_path, tiny_model):
    """vLLM's max_num_seqs depends on the accelerator (1,024 on an H100, 256 on smaller GPUs): the profile keeps
    the engine's own, and the estimate's layout uses it where the job sets none; the job's own value wins."""
    _, job = write_job(tmp_path, tiny_model, rows=2048, batches_in_flight=32)
    job["model"]["engine"] = "vllm"
    job["compute"]["batch_size"], job["output"]["shard_rows"] = 64, 64
    plan = plan_job(JobSpec.model_validate(job))
    assert layout(plan).concurrency == 256  # without a profile: the engine's declared fallback
    assert layout(plan, default_seqs=1024).concurrency == 1024
    synthetic_profile(plan, 0.0005)
    slow = estimate_plan(plan)["generation_s"]
    profile = store.load_profile(profile_key(plan))
    profile.max_num_seqs = 1024
    store.save_profile(profile)
    assert store.load_profile(profile_key(plan)).max_num_seqs == 1024
    fast = estimate_plan(plan)["generation_s"]
    assert fast < slow  # four times the sequences per step: fewer steps, each step's fixed cost shared
    job["model"]["engine_kwargs"] = {"max_num_seqs": 128}
    assert layout(plan_job(JobSpec.model_validate(job)), default_seqs=1024).concurrency == 128


def test_a_shaped_probe_row_can_be_cut_short(tmp_path, tiny_model):
    _, job = write_job(tmp_path, tiny_model)
    plan = plan_job(JobSpec.model_validate(job))
    row = {"prompt": "word " * 200, "sampling_params": None}
    cut = shaped(row, 0, 32, plan, max_chars=400)
    assert len(cut["prompt"]) == 400 and json.loads(cut["sampling_params"])["min_tokens"] == 32
    long = shaped(row, 3000, 4, plan)
    assert len(long["prompt"]) >= 3000
    chat = {"_messages": json.dumps([{"role": "user", "content": "x" * 1000}])}
    assert len(json.loads(shaped(chat, 0, 8, plan, max_chars=400)["_messages"])[-1]["content"]) == 400


def test_calibrate_probes_growing_calls_and_stores_the_profile(home, tmp_path, tiny_model, capsys):
    path, _ = write_job(tmp_path, tiny_model, rows=10)
    capsys.readouterr()
    assert main(["calibrate", path, "--rows", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    calls = out["calls"]
    # each static batch seen twice: its prefill with the first token and the call's own costs (calls 1), then its
    # decode steps, clocked apart by the engine (calls 0): the two add up to the call
    assert [c["calls"] for c in calls] == [1, 0] * (len(calls) // 2)
    steps = calls[1::2]
    assert all(c["prefill_tokens"] == 0 and c["seconds"] > 0 for c in steps)
    assert all(c["prefill_tokens"] > 0 and c["steps"] == 1 for c in calls[0::2])
    assert [round(c["seq_steps"] / c["steps"]) for c in steps[:3]] == [1, 2, 4]  # the job's rows: 1, 2, 4
    assert [c["steps"] for c in steps[3:5]] == [47, 47]  # then the fixed shapes: 48 tokens forced at 1 and 4 rows
    assert len({c["steps"] for c in steps}) > 1  # every other call cut to a quarter of max_tokens
    profile = json.loads(next((home / "profiles").glob("*.json")).read_text())
    assert profile["sources"][-1] == {**profile["sources"][-1], "kind": "probe", "rows": 7}
    assert profile["startup_s"] and len(profile["calls"]) == len(calls)
    assert len(json.loads(next((home / "lengths").glob("*.json")).read_text())["lengths"]) == 1 + 4  # full calls
    assert out["estimate"]["wall_s"] is not None and not (tmp_path / "out").exists()


def test_calibrate_times_the_run_batch_over_a_short_and_a_long_context(home, tmp_path, tiny_model, capsys):
    """Where the run holds more rows than the probe's own calls reach, the probe runs the run's batch twice: short
    prompts, then the same behind one long shared prefix (estimate_probe.LONG_CONTEXT_CHARS, at most half the
    context): the fit sees what context costs a decode step at the run's batch."""
    import yaml

    path, job = write_job(tmp_path, tiny_model, rows=10, batch_size=16)
    job["output"]["shard_rows"] = 16
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    capsys.readouterr()
    assert main(["calibrate", path, "--rows", "7", "--json"]) == 0
    steps = [c for c in json.loads(capsys.readouterr().out)["calls"] if c["calls"] == 0]  # the decode steps
    short, long = steps[-2:]
    assert short["seq_steps"] == long["seq_steps"] == 16 * 31  # 16 rows x 32 tokens: the first came with the prefill
    context = [c["ctx_steps"] / c["seq_steps"] - 32 / 2 for c in (short, long)]  # each call's prompt tokens
    assert context[1] > 2 * context[0]


def test_the_in_process_run_shows_the_engine_to_the_eta_once_ready_and_ticks_between_commits(tmp_path, tiny_model):
    """local_run.run_shards: `on_engine(engine, ready_at)` once the engine is up, before the first commit (a job
    the engine holds whole commits only at its end), and `on_tick()` while shards compute."""
    from fleetllm.batch.execution import local_run
    from fleetllm.batch.planning.job_prepare import prepare
    from fleetllm.batch.runner import make_preprocessor

    _, job = write_job(tmp_path, tiny_model, rows=8)
    job["sampling"]["max_tokens"] = 32
    spec = JobSpec.model_validate(job)
    plan = prepare(plan_job(spec, resources=local_run.local_resources_for_run(spec)))
    events: list[tuple] = []
    times = local_run.run_shards(
        plan, make_preprocessor(spec, plan.task, plan.engine, plan.reads_images),
        lambda shard, table: events.append(("commit", table.num_rows)),
        lambda engine, ready_at: events.append(("engine", ready_at, engine.progress)),
        lambda: events.append(("tick",)), tick_s=0.002)
    kinds = [e[0] for e in events]
    assert kinds.count("engine") == 1 and kinds.index("engine") < kinds.index("commit")
    assert kinds.index("engine") < kinds.index("tick") < kinds.index("commit")  # ticks while the first shard runs
    assert sum(e[1] for e in events if e[0] == "commit") == 8
    assert events[kinds.index("engine")][1] == times["ready"]


def test_a_deadline_plans_past_the_present_nodes_where_the_autoscaler_may_grow_the_cluster(
        home, tmp_path, tiny_model, ray_local):
    """Where the cluster's autoscaler reported its node groups to Ray's GCS (what Ray Data and Ray Train read), a
    deadline the present cluster cannot meet plans the replicas it needs up to that limit and names the scale-up;
    without the report the present cluster bounds the plan. The report is written where Ray's autoscaler writes it
    (Ray's open-source autoscaler of this Ray does not write it: nothing here would)."""
    import re

    from ray._raylet import GCS_AUTOSCALER_CLUSTER_CONFIG_KEY as KEY, GCS_AUTOSCALER_STATE_NAMESPACE as NS
    from ray.core.generated import autoscaler_pb2
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    from fleetllm.ray_resources import autoscaler_limits
    from fleetllm.sizing import cluster_resources

    assert autoscaler_limits() is None  # a cluster of fixed size
    _, job = write_job(tmp_path, tiny_model, rows=400, replicas="auto", cpus_per_replica=1)
    spec = JobSpec.model_validate({**job, "compute": {**job["compute"], "deadline": "10h"}})
    plan = plan_job(spec, resources=cluster_resources())
    now = plan.replicas  # 4 logical CPUs: 3 replicas and the stream's 0.5
    synthetic_profile(plan, 0.05)
    shape = job_shape(plan)
    need = None
    for deadline in ("90s", "60s", "45s", "30s"):  # the loosest deadline the present cluster cannot meet
        spec.compute.deadline = deadline
        try:
            apply_deadline(plan_job(spec, resources=cluster_resources()), shape)
        except DeadlineError as exc:
            assert f"the most replicas the cluster allows ({now})" in str(exc)
            need = int(re.search(r"meeting it needs (\d+) replicas", str(exc)).group(1))
            break
    assert need is not None and now < need <= 19, need
    config = autoscaler_pb2.ClusterConfig()
    for name, count in (("head", 1), ("cpu-workers", 4)):  # up to 20 CPUs: 19 replicas beside the stream
        group = config.node_group_configs.add(name=name, max_count=count)
        group.resources["CPU"] = 4
    _internal_kv_put(KEY, config.SerializeToString(), namespace=NS)
    try:
        assert autoscaler_limits() == {"CPU": 20.0}
        plan = plan_job(spec, resources=cluster_resources())
        chosen = apply_deadline(plan, shape)
        assert chosen["replicas"] == plan.replicas == need and chosen["scale_up"] == {
            "replicas_now": now, "resources": {"CPU": need + 0.5}}  # and the stream's 0.5 CPU
        assert any(f"of 19 the autoscaler allows; {now} fit now" in line for line in plan.describe())
    finally:
        _internal_kv_del(KEY, namespace=NS)
