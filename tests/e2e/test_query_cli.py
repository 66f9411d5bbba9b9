"""`fleetllm query` as a subprocess against the capacity-limited OpenAI-compatible server on loopback.

The server fails 30% of requests with 503; every row must still be written exactly once with its
content and with `attempts` equal to the requests the server saw for it, across a SIGKILL + resume.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import yaml

from fleetllm.testing.capacity_server import CapacityServer
from kill_mid_run import committed_shards, kill_after_commits

ROOT = Path(__file__).resolve().parents[2]
# The served model id. org/name shaped so that it also plans on a runner that still resolves
# model.source as a hub id for engine openai (see the xfail below).
MODEL = "fleetllm-test/capacity"
ROWS, SHARD_ROWS = 160, 20


def fleetllm(*args, **kw):
    return subprocess.run([sys.executable, "-m", "fleetllm", *args], cwd=ROOT, capture_output=True, text=True, **kw)


def write_spec(tmp_path: Path, base_url: str, **compute) -> Path:
    src = tmp_path / "in.jsonl"
    if not src.exists():  # rewriting it would make it another input (its shards would not resume)
            src.write_text("".join(json.dumps({"id": f"q{i:03d}", "text": f"prompt {i}"}) + "\n" for i in range(ROWS)))
    spec = {"name": "query-e2e",
            "model": {"source": MODEL, "engine_kwargs": {   # model.engine defaults to openai in `fleetllm query`
                "base_url": base_url, "max_retries": 30,
                "retry": {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}}},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": 8},
            "output": {"path": str(tmp_path / "out"), "shard_rows": SHARD_ROWS},
            "compute": {"replicas": 1, "cpus_per_replica": 0.5, **compute}}
    path = tmp_path / "query.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def read_rows(path: Path) -> list[dict]:
    return pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()


def test_query_survives_503s_and_sigkill_then_resumes_exactly_once(tmp_path):
    # 2 shards in flight at a time, so shards commit one after another and the kill lands mid-run.
    with CapacityServer(capacity=8, latency_s=0.05, failure_rate=0.3, seed=11, model=MODEL) as first:
        spec = write_spec(tmp_path, first.base_url, batches_in_flight=2)
        code, stderr = kill_after_commits(["query", str(spec)], tmp_path / "out", commits=2, timeout_s=120)
        assert code == -signal.SIGKILL, f"the run ended before it could be killed: {stderr[-2000:]}"
        first_stats = first.stats()
    committed = committed_shards(tmp_path / "out")
    assert 2 <= committed < ROWS // SHARD_ROWS

    with CapacityServer(capacity=8, latency_s=0.05, failure_rate=0.3, seed=12, model=MODEL) as second:
        spec = write_spec(tmp_path, second.base_url, batches_in_flight=2)  # same job, a new endpoint port
        resumed = fleetllm("query", str(spec), timeout=180)
        second_stats = second.stats()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Wrote {ROWS} rows" in resumed.stdout

    rows = read_rows(tmp_path / "out")
    assert sorted(r["row_id"] for r in rows) == [f"q{i:03d}" for i in range(ROWS)]  # each id exactly once
    assert all(r["error"] is None and r["generated_text"] == f"echo: {r['text']}" for r in rows)
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["rows_skipped"] == committed * SHARD_ROWS and report["engine"]["name"] == "openai"
    # attempts = the HTTP requests the endpoint saw for the row, in the run that committed it
    resumed_rows = [r for r in rows if r["text"] in second_stats["prompts"]]
    assert len(resumed_rows) == ROWS - committed * SHARD_ROWS
    for r in rows:
        seen = second_stats["prompts"] if r in resumed_rows else first_stats["prompts"]
        assert r["attempts"] == seen[r["text"]], r
    assert any(r["attempts"] > 1 for r in rows) and first_stats["failed"] + second_stats["failed"] > 10


def test_query_refuses_another_engine_and_a_missing_base_url(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"model": {"source": "m", "engine": "transformers"},
                                    "input": {"path": "in.jsonl"}, "output": {"path": "out"}}))
    proc = fleetllm("query", str(spec), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "sets model.engine: transformers" in proc.stderr and "fleetllm run" in proc.stderr
    spec.write_text(yaml.safe_dump({"model": {"source": "m"}, "input": {"path": "in.jsonl"},
                                    "output": {"path": "out"}, "compute": {"max_retries": 3}}))
    proc = fleetllm("query", str(spec), timeout=60)
    assert proc.returncode == 2 and "base_url is missing: set engine_kwargs.base_url" in proc.stderr


def test_example_query_yaml_plans(tmp_path):
    proc = fleetllm("query", "examples/query.yaml", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "engine     openai" in proc.stdout and "8 rows in 1 shard(s)" in proc.stdout
    assert "prompts    messages sent as they are; the endpoint applies its chat template" in proc.stdout


def test_retry_errors_on_query_and_run_recomputes_only_the_failed_rows(tmp_path):
    # One row's 500 while its neighbours answer: that row's error (exit 1). Healed, `query --retry-errors`
    # sends that row alone; `run --retry-errors` then has nothing left to compute.
    with CapacityServer(capacity=4, latency_s=0.02, model=MODEL, fault="status", fault_status=500,
                        fault_marker="prompt 33") as srv:
        spec = write_spec(tmp_path, srv.base_url)
        data = yaml.safe_load(spec.read_text())
        data["model"]["engine"] = "openai"  # `fleetllm run` takes the same file
        data["model"]["engine_kwargs"].update(max_retries=2, retry={"initial_backoff_s": 0.1, "max_backoff_s": 0.2})
        spec.write_text(yaml.safe_dump(data))
        first = fleetllm("query", str(spec), timeout=180)
        assert first.returncode == 1 and "1 errors" in first.stdout, first.stderr[-2000:]
        srv.options.fault = None
        seen = dict(srv.stats()["prompts"])
        again = fleetllm("query", str(spec), "--retry-errors", timeout=180)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "1 failed row(s) of the output are computed again" in again.stderr
        assert f"Wrote {ROWS} rows" in again.stdout and "(1 computed" in again.stdout and "0 errors" in again.stdout
        sent = {p: n - seen.get(p, 0) for p, n in srv.stats()["prompts"].items() if n != seen.get(p, 0)}
        assert sent == {"prompt 33": 1}
        last = fleetllm("run", str(spec), "--retry-errors", "retryable", timeout=180)
        assert last.returncode == 0 and "(0 computed" in last.stdout, last.stderr[-2000:]
        refused = fleetllm("run", str(spec), "--retry-errors", "--overwrite", timeout=60)
        assert refused.returncode == 2 and "give one of them" in refused.stderr
    rows = read_rows(tmp_path / "out")
    assert sorted(r["row_id"] for r in rows) == [f"q{i:03d}" for i in range(ROWS)]
    assert all(r["error"] is None and r["generated_text"] == f"echo: {r['text']}" for r in rows)
